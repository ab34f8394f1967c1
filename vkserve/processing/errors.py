"""The one error of this package; the scheduler answers it as BAD_REQUEST (a request's image)
and the registry reports it as the model folder's error (a config.toml table)."""


class ProcessingError(ValueError):
    """Bad processing settings or a bad image; the message names what and where."""
