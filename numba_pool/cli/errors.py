"""The command line's one-line errors (``Error: ...``, no traceback) and warnings (``numba-pool: warning: ...``), and
the checks before a command does anything; ``numba-pool-tools``' too.  Exit status 2: bad configuration, options or
input files (:class:`Failure`); 3: no CUDA GPU here, or only the simulator (:class:`NoGpu`)."""

from __future__ import annotations

import warnings

import click

from ..cuda import frontend as frontends
from ..cuda import simulator
from .. import config as _config


class Failure(click.ClickException):
    """A user-facing error: printed as ``Error: ...``, exit status 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))  # one line, whatever the cause said


class NoGpu(Failure):
    """No CUDA GPU here (or only the CUDA simulator): printed as ``Error: ...``, exit status 3."""

    exit_code = 3


class OneLineErrors(click.Group):
    """Usage errors as one line, ``Error: ...``, without Click's usage lines, and a command's warnings as one line
    naming the command, not a frame of Click's; the class of every group (``numba-pool``, ``numba-pool-tools``...)."""

    def make_context(self, info_name, args, parent=None, **extra):
        if not args:  # the command, or a group such as `numba-pool-tools snapshot`, alone: its help, exit status 0
            args = ["--help"]
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as err:
            err.ctx = None  # UsageError.show prints the usage and a hint only with a context
            raise

    def invoke(self, ctx):
        with warnings.catch_warnings():  # the display restored after: a command may run inside a program (a test's)
            warnings.showwarning = lambda message, *_: click.echo(f"{ctx.find_root().info_name}: warning: {message}",
                                                                  err=True)
            try:
                return super().invoke(ctx)
            except click.UsageError as err:  # from the subcommand's arguments
                err.ctx = None
                raise


def load_config() -> _config.PoolConfig:
    """The ``NUMBA_POOL_*`` environment's configuration.  :raises Failure: naming a bad variable and its value."""
    try:
        return _config.load()
    except _config.ConfigError as err:
        raise Failure(str(err)) from None


def tools_frontend():
    """The commands' frontend (:func:`~numba_pool.cuda.frontend.for_tools`), imported now.
    :raises Failure: when none is installed, or ``NUMBA_POOL_FRONTEND`` names none."""
    try:
        return frontends.for_tools()
    except frontends.FrontendError as err:
        raise Failure(str(err)) from None


def gpu_available() -> bool:
    """Whether the tools' frontend has a real CUDA GPU here (the simulator's ``is_available()`` is true too).
    :raises Failure: as :func:`tools_frontend`."""
    frontend = tools_frontend()
    return not frontend.simulator and frontend.cuda.is_available()


def require_gpu() -> None:
    """:raises NoGpu: the tools' frontend has no CUDA GPU here, or only the simulator; Failure: as tools_frontend."""
    frontend = tools_frontend()
    if frontend.simulator:  # where cuda.is_available() is True
        raise NoGpu(simulator.NO_GPU)
    if not frontend.cuda.is_available():
        raise NoGpu(f"no CUDA GPU is available here ({frontends.PACKAGES[frontend.name]}.is_available() is False): "
                    "numba-pool needs one for this command")
