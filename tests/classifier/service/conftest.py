import pytest
from _toy import toy_classifier


@pytest.fixture(scope="module")
def fitted():
    """The toy classifier every service test serves (fitted once per module, saved by each fixture)."""
    return toy_classifier()
