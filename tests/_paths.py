"""Paths the tests share, in one place, so a test file can move between the layer folders
without recomputing the repository root from its own depth."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
