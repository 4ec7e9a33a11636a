"""Fixtures for the daemon tests: a private runtime directory and a workspace holding a
copy of the MLP example, real daemon processes on them, and a check that no daemon,
compiler or job process of the workspace outlives its test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon.support import Env, make_env


@pytest.fixture(scope="module")
def shared() -> Iterator[Env]:
    """One daemon for the tests that leave it serving."""
    env = make_env()
    yield env
    env.teardown()


@pytest.fixture
def env() -> Iterator[Env]:
    """A daemon of its own, for tests that kill, stop or reconfigure it."""
    env = make_env()
    yield env
    env.teardown()
