"""The licence a user is told about (pyproject.toml, the image's label) is the one in the
repository, in full: Apache-2.0 obliges whoever redistributes it to pass its text on."""

from __future__ import annotations

import tomllib

from tests.support.tools import REPO


def test_the_license_file_is_the_full_apache_2_0_text_that_pyproject_declares() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert declared["license"] == "Apache-2.0"
    assert declared["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    words = text.split()
    assert words[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    # The whole text, not a stub: all nine sections and the appendix.
    for heading in (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ):
        assert heading in text
    assert 11_000 < len(text) < 12_000


def test_the_image_label_names_the_same_license() -> None:
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (REPO / "Dockerfile").read_text()
