"""Error types the CLI turns into a one-line message and a non-zero exit (no traceback)."""


class BertflowError(Exception):
    """A problem the user can fix: bad params, bad input data, a failed expectation."""


class ConfigError(BertflowError, ValueError):
    """A params file has an unknown key, a missing section or a value of the wrong type."""


class DataError(BertflowError):
    """Input data can't be used; the message names the file and, where known, the row."""


class ValidationError(DataError):
    """A Great Expectations suite failed on a stage's data; the message lists what failed."""
