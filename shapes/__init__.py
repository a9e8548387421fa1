"""The arms as Locust ``LoadTestShape``s; always imported as ``tailgate.shapes``."""

if __name__ != "tailgate.shapes":  # a checkout with its root on sys.path would also offer "shapes"
    raise ImportError(f"import tailgate.shapes, not {__name__}: one file under two names would load twice")
