# Owner: test_install.py. Registers the marker its slower tests carry, so that
# `pytest -m "not slow"` can deselect them; they run by default.


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: runs pip/venv or several fresh interpreters (seconds); runs by default"
    )
