"""Helpers shared by the test groups (imported as ``tests.support.*``)."""
