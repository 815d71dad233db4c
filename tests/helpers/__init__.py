"""Code shared by several test files: tables and rows (`tables`), distribution checks (`sampling`) and
other processes (`processes`). Fixtures stay in tests/conftest.py."""
