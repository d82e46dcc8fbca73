"""What the PostgreSQL store's description and its target both say: the URL schemes and how
to install the driver. Apart, so that neither imports the other."""

SCHEMES = ("postgresql", "postgres")
EXTRA = "postgresql"  # pyproject.toml's [project.optional-dependencies]
INSTALL = f"pip install 'leader-sidecar[{EXTRA}]'"
