"""What the SDK scripts share (run from this directory: the script's own directory is on sys.path)."""


def expect(exc_type, fn):
    """Call fn, which must raise exc_type; return the exception."""
    try:
        fn()
    except exc_type as e:
        return e
    raise AssertionError(f"expected {exc_type.__name__}")
