"""The one base class of the errors a user can fix: a file, an option, a checkpoint or data that cannot work.

Its message names what is wrong and the fix. The scripts print such an error as one line, without the traceback
(`--debug` or PROJECT_DEBUG=1 shows it); every other exception keeps its traceback, as a bug should.
"""


class ProjectError(Exception):
    """Base of every error the project raises about its input."""


class ConfigError(ProjectError, ValueError):
    """An option, config file, checkpoint or weights file that cannot work as given."""


class MissingFileError(ProjectError, FileNotFoundError):
    """A file or folder that is not where the option says."""


class StorageError(ProjectError, OSError):
    """A file or folder that cannot be written where the option puts it: a full disk, a folder that cannot be made."""


class DataError(ProjectError, ValueError):
    """Data files that are not what the datamodule reads: corrupt, empty, mislabelled."""


class InterfaceError(ProjectError, TypeError):
    """A model, datamodule or callback without what the project needs from it (its contract)."""


class MissingPackageError(ProjectError, ModuleNotFoundError):
    """An optional package a chosen feature needs; the message gives the install command."""
