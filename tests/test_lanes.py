"""A test whose dependency is missing skips on a developer's machine and fails under CI (`tests/helpers.py`
`missing`), where the setup installs every dependency and a skip would hide a check that never ran."""

from __future__ import annotations

import pytest

from tests.helpers import missing


def test_a_missing_dependency_skips_here_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"the thing is missing \(install it\)"):
        missing("the thing", "install it")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the thing is missing, and CI must run this test: install it"):
        missing("the thing", "install it")
