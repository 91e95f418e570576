"""A training run's progress as log lines: step, loss, tokens/s and ETA about once a minute,
where no progress bar draws (stderr a log file or pipe; components/core/progress.py)."""

from __future__ import annotations

import logging
import time

import lightning as L

from components.core.progress import duration, eta

log = logging.getLogger(__name__)


class ProgressLines(L.Callback):
    """Every `seconds`, on the first rank: `pretrain: step 120/3544 (3%), loss 5.12,
    8,430 tokens/s, 2.1 min elapsed, ETA 58.3 min`. Tokens come from the module's
    `tokens_seen` (all ranks'), counted from this process's start, so a resumed run's rate and
    ETA are its own."""

    def __init__(self, name: str, seconds: float):
        self.name, self.seconds = name, seconds
        self._start: tuple[float, int, int] | None = None  # time, step, tokens at the first batch
        self._last = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero:
            return
        now, step, tokens = time.monotonic(), trainer.global_step, getattr(pl_module, "tokens_seen", 0)
        if self._start is None:
            self._start, self._last = (now, step, tokens), now
            return
        if now - self._last < self.seconds:
            return
        self._last = now
        since, step0, tokens0 = self._start
        elapsed, total = now - since, trainer.max_steps if trainer.max_steps > 0 else None
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        of = f"/{total} ({step / total:.0%})" if total else ""
        log.info("progress: %s: step %d%s, loss %.4g, %s tokens/s, %s elapsed, %s", self.name, step, of,
                 float(loss), f"{(tokens - tokens0) / max(elapsed, 1e-9):,.0f}", duration(elapsed),
                 eta(elapsed, step - step0, total - step0 if total else None))
