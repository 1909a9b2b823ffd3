"""The plain test runner of the Python suites (run as scripts by scripts/test.d/40-openai.sh):
every callable named test_* of the calling module, in name order, each failure's traceback
printed, then one 'N passed, N failed' line and exit status 1 if anything failed."""

import sys
import traceback


def run_tests(namespace):
    tests = [(n, f) for n, f in sorted(namespace.items()) if n.startswith("test_") and callable(f)]
    passed = failed = 0
    for name, f in tests:
        try:
            f()
            passed += 1
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
