"""The one pair a server holds in memory: chosen by (target, draft spec), loaded and warmed up in
the background when a server starts (``preload``) or else on first use, switched with the
tokenizers checked first; a switch starts a new Session (its cached baselines and learnt prices
belong to the old pair).

Terms
-----
state    "ready" (a Session is in memory), "loading" (a load is under way, or the preloader is
         about to start one), "failed" (the last load raised: ``error``; the next ``session()``
         tries again) or "idle" (nothing loaded and nothing loading: the first use loads).
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any, Callable

import torch

from ears_core.threads import join_at_exit
from ears_core.pair import ModelPair, check_pair, load_pair, resolve_draft
from ears_core.serve.runs import ActivityLog
from ears_core.serve.session import Session
from ears_core.serve.settings import Settings

__all__ = ["PairSlot"]

LOG = logging.getLogger("ears_studio")


class PairSlot:
    """The one pair in memory (see the module's terms), thread-safe.

    ``settings`` give the configured pair and how to load (device, cache, downloads);
    ``default_loader()`` loads the configured pair instead (tests inject a tiny one) and
    ``loader(target, draft)`` any other (default ``models.load_pair`` on the settings).
    ``background_prices``: its Sessions measure the price curve again between requests (serve/prices.py);
    off where nothing may run between requests (a ZeroGPU worker holds no GPU then: studio/zerogpu.py)."""

    background_prices = True

    def __init__(self, settings: Settings | None = None, default_loader: Callable[[], ModelPair] | None = None,
                 loader: Callable[[str, str | None], ModelPair] | None = None,
                 activity: ActivityLog | None = None) -> None:
        self.settings = settings or Settings()
        self.default: tuple[str, str | None] = (self.settings.target, self.settings.draft)
        self.choice = self.default  # the pair in memory, or the one to load on first use
        self._default_loader, self._loader, self._activity = default_loader, loader or self._load_pair, activity
        self._session: Session | None = None
        self._lock = threading.Lock()
        self.error: BaseException | None = None  # the last load's failure, until a load succeeds
        self.preloader: threading.Thread | None = None

    def _load_pair(self, target: str, draft: str | None) -> ModelPair:
        s = self.settings
        return load_pair(target, draft, device=s.torch_device, cache_dir=s.cache, allow_download=s.allow_download)

    @staticmethod
    def same(a: tuple[str, str | None], b: tuple[str, str | None]) -> bool:
        """Whether two (target, draft spec) choices name one pair once "auto" is resolved."""
        return a[0] == b[0] and resolve_draft(*a) == resolve_draft(*b)

    def _injected(self, choice: tuple[str, str | None]) -> bool:
        return self._default_loader is not None and self.same(choice, self.default)

    def _load(self, choice: tuple[str, str | None]) -> Session:
        try:
            pair = self._default_loader() if self._injected(choice) else self._loader(*choice)
            # the cached price curve and a short decode, before any request is timed; the curve is
            # measured again between requests, never on a request's path (serve/prices.py)
            session = Session(pair, self._activity, cache_dir=self.settings.cache,
                              background_prices=self.background_prices)
            session.warm_up()
        except BaseException as exc:
            self.error = exc
            raise
        self.error = None
        return session

    def preload(self) -> threading.Thread:
        """Load and warm up the chosen pair in a background thread, now (a server's start), so the
        first request finds it ready; a request that comes sooner waits for it in ``session()``. A
        failure is logged and kept in ``error``, and the next ``session()`` tries again."""
        def run() -> None:
            try:
                self.session()
            except BaseException:  # noqa: BLE001 - a thread's failure is logged, the request that retries reports it
                LOG.warning("the model pair did not load in the background", exc_info=True)

        thread = join_at_exit(threading.Thread(target=run, name="pair-preload", daemon=True))  # a load: no stop
        self.preloader = thread  # "loading" from here on, before the thread takes the lock
        thread.start()
        return thread

    @property
    def state(self) -> str:
        """"ready", "loading", "failed" or "idle" (see the module's terms)."""
        if self._session is not None:
            return "ready"
        preloading = self.preloader is not None and self.preloader.is_alive()
        if preloading or self._lock.locked():
            return "loading"
        return "failed" if self.error is not None else "idle"

    def session(self) -> Session:
        """The Session on the chosen pair, loading it on first use."""
        with self._lock:
            if self._session is None:
                self._session = self._load(self.choice)
            return self._session

    @property
    def loaded(self) -> Session | None:
        return self._session

    def decode_budget_s(self) -> float:
        """Seconds of decoding a request may spend, asked once its Session is ready: ``Settings.timeout_s``
        (a ZeroGPU Space's slot also counts what its call spent starting up: studio/zerogpu.py)."""
        return self.settings.timeout_s

    def switch(self, target: str, draft: str | None, check: bool = True,
               progress: Callable[[str], Any] | None = None) -> Session:
        """Make (target, draft) the pair in memory. The tokenizers are checked first (seconds), so a
        pair that is not cached or does not match fails while the current pair stays; then the
        current pair is dropped before the new one loads. If that load fails, the previous choice
        loads again on the next ``session()``."""
        choice = (target, draft)
        with self._lock:
            if self._session is not None and self.same(choice, self.choice):
                return self._session
            if check and not self._injected(choice):
                check_pair(target, draft, cache_dir=self.settings.cache, allow_download=self.settings.allow_download)
            if self._session is not None:
                self._session.close()  # its background price measurements stop with it
            previous, self._session = self.choice, None
            _free_memory()
            if progress is not None:
                progress(f"loading {target}" + ("" if draft is None else f" <- {draft}"))
            try:
                self._session = self._load(choice)
            except BaseException:
                self.choice = previous
                _free_memory()
                raise
            self.choice = choice
            return self._session


    def close(self) -> None:
        """Stop the pair's background work (price measurements between requests): the server closes."""
        if self._session is not None:
            self._session.close()


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
