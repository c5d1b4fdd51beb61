"""Test helpers shared by the test packages (tests/ is on pytest's pythonpath)."""
