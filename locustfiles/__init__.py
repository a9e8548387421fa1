"""The thin locustfiles users point Locust at; as a package, always ``tailgate.locustfiles``."""

if __name__ != "tailgate.locustfiles":  # a checkout with its root on sys.path would also offer "locustfiles"
    raise ImportError(f"import tailgate.locustfiles, not {__name__}: one file under two names would load twice")
