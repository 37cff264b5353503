"""A worker that runs out of memory starts again with half its micro-batch, each time, whether or not
it could say so first (``WorkerPool.schedule_restart``): the daemon's back-off, without processes."""

from __future__ import annotations

from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.worker_pool import WorkerPool
from p2ptrain.daemon.worker_slots import WorkerRestarts
from p2ptrain.worker_pipe import OUT_OF_MEMORY_EXIT_CODE, Error, WorkerPlan


class Events:
    def record(self, *args, **kwargs):
        pass


def pool_with_a_training_worker() -> WorkerPool:
    run = RunView(run_id="r")
    run.worker("cpu", "cpu")
    run.states.move("cpu", run.workers["cpu"], "training")
    pool = WorkerPool(paths=None, config=None, run=run, events=Events(), listener=None)
    pool.restarts = {"cpu": WorkerRestarts()}  # what joining a run sets up, one per worker slot
    return pool


def start_again(pool: WorkerPool) -> None:
    """What ``WorkerPool.start`` does to the worker's records when it starts its next process."""
    pool.restarts["cpu"].ran_out_of_memory = False
    pool.run.states.move("cpu", pool.run.workers["cpu"], "joining")
    pool.run.states.move("cpu", pool.run.workers["cpu"], "training")


def test_each_out_of_memory_exit_halves_the_micro_batch_it_was_started_with():
    pool = pool_with_a_training_worker()
    # the first process says where it ran out of memory, then exits
    pool.ran_out_of_memory("cpu", Error(message="out of memory", out_of_memory=True, micro_batch=64, grad_accum=1))
    ended = pool.schedule_restart("cpu", OUT_OF_MEMORY_EXIT_CODE, WorkerPlan(micro_batch=64, grad_accum=1))
    assert ended.out_of_memory and pool.restarts["cpu"].micro_batch_cap() == (32, 2)
    # the next one, started at 32 x 2, is killed by the allocator before it can report
    start_again(pool)
    ended = pool.schedule_restart("cpu", OUT_OF_MEMORY_EXIT_CODE, WorkerPlan(micro_batch=32, grad_accum=2))
    assert ended.out_of_memory
    assert pool.restarts["cpu"].out_of_memory_at == (32, 2), "the event and the back-off would name 64 again"
    assert pool.restarts["cpu"].micro_batch_cap() == (16, 4), "it would start at 32 again, and again"
    assert pool.restarts["cpu"].micro_batch_halvings == 2


def test_a_crash_that_is_not_out_of_memory_keeps_the_micro_batch():
    pool = pool_with_a_training_worker()
    ended = pool.schedule_restart("cpu", 1, WorkerPlan(micro_batch=64, grad_accum=1))
    assert not ended.out_of_memory and pool.restarts["cpu"].micro_batch_cap() is None
