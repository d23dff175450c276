"""LitData's streaming loader, placed at the Trainer's position (imported only when LitData is installed)."""

from __future__ import annotations

from typing import Any

from litdata import StreamingDataLoader, StreamingDataset

from lightning_template.engine.sampling import ResumesFromLoop, fit_position


class LoopPositionedLoader(StreamingDataLoader, ResumesFromLoop):
    """LitData's loader, placed at the Trainer's position each time an epoch starts.

    Epoch e of the run is LitData's epoch e + 1 (its shuffle), and a run resumed in the middle of
    it skips the batches the restored loop already trained, through LitData's own state
    (`state_dict` / `load_state_dict`). Why not the loader state Lightning stores in checkpoints:
    Lightning restores it only when resuming mid-epoch, and LitData counts epochs as whole passes,
    while a Trainer epoch may end early (`limit_train_batches`): a run resumed from an epoch-end
    checkpoint then replayed the first epoch's order.
    """

    worker_dependent = True  # LitData gives each worker its own share of the chunks

    def __init__(self, dataset: StreamingDataset, trainer: Any, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.trainer = trainer

    def __iter__(self) -> Any:
        # A generator: the position is read when the first batch is asked for, not when Lightning creates
        # the iterator (it does so before restoring the loop from a checkpoint, to count the steps).
        epoch, batches_done = fit_position(self.trainer) or (self.current_epoch, 0)
        if batches_done:
            self._num_samples_yielded_streaming = batches_done * self.batch_size
            state = self.state_dict()
            state["current_epoch"] = state["dataset"]["current_epoch"] = epoch + 1
            state["latest_worker_idx"] = (batches_done - 1) % max(self.num_workers, 1)  # workers take turns
            self.load_state_dict(state)
        else:
            self.current_epoch, self.restore = epoch, False  # LitData's __iter__ counts it up by one
        yield from super().__iter__()
