import pytest

from cem_reference import randomize


@pytest.fixture
def rand():
    return randomize
