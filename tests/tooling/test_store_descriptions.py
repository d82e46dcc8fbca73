"""A store is one folder plus one line in `sidecar.backends.STORES` (docs/development.md,
"Adding a store"). Every store is loaded here through that list and its description checked:
its URL schemes are its own, its options are named after it, its secrets never reach a log
line, and the contract suite runs against it."""

from __future__ import annotations

import pytest

from sidecar import backends, commands, config
from sidecar.cli import scrubber
from sidecar.redact import HIDDEN, secret_values
from tests.support.tools import REPO

STORES = {store.name: store for store in backends.STORES}
SECRET = "s3cret-value-of-a-test"


def test_the_list_names_each_store_once_after_its_folder() -> None:
    assert len(STORES) == len(backends.STORES)
    for name in STORES:
        assert (REPO / "sidecar" / "backends" / name / "description.py").is_file(), name


def test_no_two_stores_answer_one_scheme() -> None:
    schemes = [scheme for store in backends.STORES for scheme in store.schemes]
    assert len(schemes) == len(set(schemes)), schemes


@pytest.mark.parametrize("name", sorted(STORES))
def test_a_store_answers_its_own_schemes_and_only_those(name: str) -> None:
    store = STORES[name]
    assert backends.store_of(store.example) is store
    for scheme in store.schemes:
        assert backends.store_of(f"{scheme}://somewhere") is store
    assert store.forms in backends.STORE_HELP
    assert store.shown in config.OPTIONS[0].help  # --store's help lists it


@pytest.mark.parametrize("name", sorted(STORES))
def test_every_option_of_a_store_is_named_after_it(name: str) -> None:
    store = STORES[name]
    prefix = store.prefix  # the name, or a flag older than this rule (--kubeconfig)
    for option in store.options:
        assert option.flag == f"--{prefix}" or option.flag.startswith(f"--{prefix}-"), option
        assert option.env.startswith(config.ENV_PREFIX + prefix.upper().replace("-", "_"))


def test_every_options_flag_is_taken_once_and_offered_to_the_sidecar_and_status() -> None:
    flags = [option.flag for option in config.OPTIONS]
    assert len(flags) == len(set(flags))
    status = {option.flag for option in commands.status_options()}
    for store in backends.STORES:
        for option in store.options:
            assert option.flag in flags
            assert option.flag in status  # status reads the same store as the sidecar


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        (store.name, option.flag)
        for store in backends.STORES
        for option in store.options
        if option.secret
    ],
)
def test_a_secret_option_is_hidden_from_every_line_the_sidecar_writes(name: str, flag: str) -> None:
    loaded = config.load(["--store", STORES[name].example, "--lease", "x", flag, SECRET], {})
    assert SECRET in loaded.store_settings.secrets()
    scrub = scrubber(loaded, {})
    assert scrub(f"AUTH failed for {SECRET}") == f"AUTH failed for {HIDDEN}"
    assert SECRET not in repr(loaded)


def test_the_secret_options_are_the_password_options() -> None:
    for store in backends.STORES:
        for option in store.options:
            assert option.secret == (option.metavar == "PASSWORD"), option.flag


@pytest.mark.parametrize("name", sorted(STORES))
def test_a_password_in_a_store_url_is_hidden(name: str) -> None:
    store = STORES[name]
    if "://" not in store.example or store.example.startswith("sqlite:"):
        pytest.skip(f"{name} takes no credentials in its URL")
    scheme, _, rest = store.example.partition("://")
    url = f"{scheme}://someone:{SECRET}@{rest.rpartition('@')[2]}"
    assert SECRET in secret_values([url], {})


@pytest.mark.parametrize("name", sorted(STORES))
def test_the_contract_suite_runs_against_every_store(name: str) -> None:
    """tests/contract/conftest.py runs the contract against each harness_*.py."""
    assert (REPO / "tests" / "contract" / f"harness_{name}.py").is_file()


def test_the_stores_commands_and_extras_are_in_the_servers_help() -> None:
    epilog = config.server_epilog()
    for store in backends.STORES:
        for command in store.commands:
            assert f"leader-sidecar {command.name} " in epilog
        for what, install in store.extras:
            assert what in epilog
            assert install in epilog
