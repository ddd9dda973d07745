"""numba_pool's state in this process, in one object, :data:`process`: the managers initialized (every device
and frontend) and their classes, the configuration in effect, the history recording, the count of open
statistics scopes, the out-of-memory observers and switches, and the IPC lease queue.

The layers below never import this module: the plugin hands them what they need.  A public
function that switches an adaptor changes the state here, then recomposes every manager's path
(:meth:`ProcessState.recompose`), directly: no listeners.  Other module-level variables:
docs/architecture.md, "Module-level state" (``tests/package/test_module_state.py`` keeps it whole).

Locks: :attr:`ProcessState._lock` is innermost: no other numba_pool lock is taken under it
(:meth:`ProcessState.recompose` copies the managers first), so a manager's initialization may take it."""

from __future__ import annotations

import threading
import weakref
from typing import Callable

from .. import config as _config
from ..ipc.leases import LeaseQueue
from ..observe.history import History


class ProcessState:
    """The state numba_pool shares across the process (one instance: :data:`process`)."""

    def __init__(self):
        self._lock = threading.Lock()  # guards everything below but `recording`'s reads
        self._managers = weakref.WeakSet()  # managers initialized at least once, every frontend's
        self._classes: dict[str, type] = {}  # frontend name -> its manager class
        self._config: _config.PoolConfig | None = None  # install()'s, or the environment's once read
        #: The history recording in effect, or None (off); read without the lock (one load).
        self.recording: History | None = None
        self._scopes_open = 0  # statistics scopes open now, every thread
        self._observers: list[Callable] = []  # numba_pool.on_out_of_memory's callbacks
        self._dumped: set[str] = set()  # NUMBA_POOL_OOM_SNAPSHOT paths written (the first out of memory only)
        self._leak_report = False  # the leak report is registered with atexit
        #: Releases of exported blocks waiting for their importers (the IPC lease thread's queue;
        #: finalizers add to it through each block's ``LeaseHold``, without a lock).
        self.leases = LeaseQueue()
        #: The PyTorch door (:mod:`.torch_allocator`), made at the first ``numba_pool.torch_allocator()``.
        self.torch_door = None
        #: The CuPy door's null-stream allocations (:class:`.cupy_allocator.CupyDoor`), made at the first one.
        self.cupy_door = None
        self._making_door = threading.Lock()  # guards making cupy_door (not _lock: a door joins the set under it)
        self._free_list_doors = weakref.WeakSet()  # every door with a free list (the CUDA model makes its own)
        self._resets: dict[int, int] = {}  # device ordinal -> resets under way (their doors' free lists paused)
        self._doors_keep = True  # whether the doors' free lists keep blocks (not while a history records)
        self._switching = threading.Lock()  # one set_recording at a time: its doors' switches in its order
        #: device ordinal -> weak reference to the manager the doors allocate through (:mod:`.serving`);
        #: read and set without the lock (one dict operation each).
        self.door_managers: dict = {}
        #: The CuPy door's ``(last Stream named, its StreamRef)`` (Note [The last stream named]); set whole, no lock.
        self.cupy_stream: tuple = (None, None)

    # -- the managers -----------------------------------------------------------------------
    def register(self, manager) -> None:
        """Count ``manager`` among the process's (from its first initialization, while it lives)."""
        with self._lock:
            self._managers.add(manager)

    def managers(self) -> list:
        """The managers initialized at least once, every frontend's, alive now."""
        with self._lock:
            return list(self._managers)

    def manager_class(self, frontend, make: Callable[[], type]) -> type:
        """``frontend``'s manager class: ``make()``'s, made once per frontend."""
        with self._lock:
            cls = self._classes.get(frontend.name)
            if cls is None:
                cls = self._classes[frontend.name] = make()
            return cls

    def recompose(self) -> None:
        """Compose every manager's path again (``NumbaPoolManager.recompose``) after an adaptor's switch."""
        for manager in self.managers():
            manager.recompose()

    # -- the configuration ------------------------------------------------------------------
    def config_in_effect(self) -> _config.PoolConfig:
        """The installed configuration; the environment's, read now, when none was.

        :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad."""
        with self._lock:
            if self._config is None:
                self._config = _config.load()
            return self._config

    def installed(self) -> _config.PoolConfig | None:
        """The configuration in effect, or None before ``install()`` or a manager read the environment."""
        with self._lock:
            return self._config

    def set_config(self, config: _config.PoolConfig | None) -> None:
        """Make ``config`` that of managers initialized from now on (None: the environment's, read then)."""
        with self._lock:
            self._config = config

    # -- the adaptors' switches -------------------------------------------------------------
    def set_recording(self, recording: History | None) -> None:
        """Record into ``recording`` from now on (None: stop), then compose every path again; the doors'
        free lists stop keeping blocks while it records (each allocation is recorded)."""
        with self._switching:
            if recording is not None:  # the doors first: no reuse between the recording's start and their switch
                for door in self._doors_switched(False):
                    door.native.switch(False)
            with self._lock:
                self.recording = recording
            if recording is None:
                for door in self._doors_switched(True):
                    door.native.switch(True)
        self.recompose()

    def _doors_switched(self, keep: bool) -> list:
        # The doors to switch, read with the state a door made from now on takes (add_free_list_door): none is missed
        with self._lock:
            self._doors_keep = keep
            return list(self._free_list_doors)

    # -- the doors' free lists (Note [The doors' free lists]) ----------------
    def add_free_list_door(self, door) -> None:
        """Count ``door`` (a ``KeepsFreedBlocks`` door with a free list) among those the managers give back from,
        while it lives; switched off while a history records, paused for each reset under way (it holds no block
        yet: no Python runs under the lock)."""
        with self._lock:
            self._free_list_doors.add(door)
            door.native.switch(self._doors_keep)  # (a door switched off while a history records)
            for device, resets in self._resets.items():
                for _ in range(resets):
                    door.native.forget_device(device, 1)

    def pause_free_lists(self, device: int, pause: int) -> None:
        """A reset of ``device`` starts (``pause`` 1) or ends (-1) in every door with a free list (``forget_device``).
        The count and the doors are read together, so a door made meanwhile is paused exactly once."""
        with self._lock:
            resets = self._resets.get(device, 0) + pause
            self._resets[device] = max(resets, 0)
            doors = list(self._free_list_doors)
        for door in doors:
            door.forget_device(device, pause)

    def cupy_door_made(self, make: Callable[[], object]):
        """The CuPy door, made by ``make()`` at the first call, once: its arrays' owners free through it."""
        with self._making_door:
            if self.cupy_door is None:
                self.cupy_door = make()
            return self.cupy_door

    def free_list_doors(self) -> list:
        """The doors with a free list, alive now."""
        with self._lock:
            return list(self._free_list_doors)

    def counting(self) -> bool:
        """Whether a statistics scope is open anywhere (the counting adaptor must be in every path)."""
        with self._lock:
            return self._scopes_open > 0

    def scope_opened(self) -> bool:
        """Count a scope opening; True when it is the only one open (compose the paths)."""
        with self._lock:
            self._scopes_open += 1
            return self._scopes_open == 1

    def scope_closed(self) -> bool:
        """Count a scope closing; True when none is left open (compose the paths)."""
        with self._lock:
            self._scopes_open -= 1
            return self._scopes_open == 0

    # -- out of memory and leaks ------------------------------------------------------------
    def add_observer(self, callback: Callable) -> None:
        """Call ``callback`` at each out-of-memory error (:mod:`numba_pool.plugin.debugging`)."""
        with self._lock:
            self._observers.append(callback)

    def out_of_memory_targets(self, oom_snapshot: str | None) -> tuple[list[Callable], bool]:
        """The observers to call at an out-of-memory error, and whether to write the snapshot
        file ``oom_snapshot`` (the first time for that path only; then counted as written)."""
        with self._lock:
            write = oom_snapshot is not None and oom_snapshot not in self._dumped
            if write:
                self._dumped.add(oom_snapshot)
            return list(self._observers), write

    def leak_report_once(self) -> bool:
        """True the first time only: register the leak report then."""
        with self._lock:
            first, self._leak_report = not self._leak_report, True
            return first


#: The process's state: the one instance.
process = ProcessState()
