"""The one exception type users see as a single clear line (the CLI prints it and exits non-zero)."""


class GpunnError(Exception):
    """A problem the user can fix: bad input file, bad config key, missing data. The message is one line
    that names the file or key and says what to do."""
