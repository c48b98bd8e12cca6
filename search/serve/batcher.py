"""`SearchBatcher`: a static model's unfiltered searches, answered together, on the event loop while they are
cheap."""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
import weakref
from typing import Callable

from starlette.concurrency import run_in_threadpool

from common.errors import PipelineError
from search.engine import SearchEngine
from search.serve.schemas import SearchRequest


class SearchBatcher:
    """A static model's unfiltered searches, answered on the event loop, several at a time: the requests
    that arrive together (one turn of the loop) wait for one `search_many` per (k, mode, weight), whose
    one FAISS call reads the vectors once for all of them. Why on the event loop: a static model's search
    is short, mostly Python holding the interpreter lock, so worker threads would only take turns at it and
    pay for the hand-offs (a hybrid request cost the server more CPU through the thread pool than on the
    loop one at a time). A batch is answered WAIT_TURNS more turns of the loop after the turn its first
    request joined it: a request read in one turn reaches the batcher up to two turns later (the app awaits
    its way there), so waiting gathers the requests that arrived together (larger batches, and under load
    more requests/s and a shorter tail). An idle server waits microseconds. Shards answering from other
    processes (Ray Serve) are awaited in a worker thread, the batch still one call to each shard: a blocking
    wait on the event loop would stall every other request.

    A large collection's searches are not cheap: at ten million chunks a hybrid search is mostly BM25 and
    FAISS, which let go of the interpreter lock. On the loop, a batch stops the server for its whole time
    and the next batch waits for it, so one core idles: with few clients worker threads served more
    requests/s at lower latency (with many, the two were alike), while at 200k chunks, whose searches are
    cheaper, the loop was still better under load. So the batcher times each engine's searches on the loop,
    each kind apart (a mode, filtered or not: a large index's dense search costs far less than its hybrid):
    past WARM_UP_BATCHES (a fresh index reads its files from disk), when a search took ON_LOOP_MAX_S or more
    at the median of the next MEASURED_BATCHES, that kind's later searches are answered in worker threads (as
    many at once as the server has search threads). A reloaded index is a new engine, timed anew.

    Measured: benchmarks/results/2026-11-28-design-measurements-cpu.md."""

    WAIT_TURNS = 2
    WARM_UP_BATCHES = 8
    MEASURED_BATCHES = 16
    ON_LOOP_MAX_S = 0.010  # seconds a search (a batch's time over its searches) may take to stay on the loop

    def __init__(self):
        self.pending: list[tuple[SearchEngine, SearchRequest, asyncio.Future]] = []
        # per engine, per kind of search (mode, filtered): the seconds a search took on the loop
        self._timings: weakref.WeakKeyDictionary[SearchEngine, dict[tuple, list[float]]] = weakref.WeakKeyDictionary()

    def on_loop(self, engine: SearchEngine, kind: tuple[str | None, bool]) -> bool:
        """Whether `engine`'s searches of this kind (mode, filtered) are answered on the event loop: in this
        process, and not timed costly."""
        if not engine.in_process:
            return False
        timed = self._timings.get(engine, {}).get(kind, [])
        if len(timed) < self.WARM_UP_BATCHES + self.MEASURED_BATCHES:
            return True
        return statistics.median(timed[self.WARM_UP_BATCHES :]) < self.ON_LOOP_MAX_S

    def run_on_loop(self, engine: SearchEngine, kind: tuple[str | None, bool], answer: Callable, searches: int):
        """answer() (`searches` searches of this kind), timed while the kind is still being measured."""
        timed = self._timings.setdefault(engine, {}).setdefault(kind, [])
        if len(timed) >= self.WARM_UP_BATCHES + self.MEASURED_BATCHES:
            return answer()
        start = time.perf_counter()
        answered = answer()  # one that raised is not timed: it stopped short
        timed.append((time.perf_counter() - start) / searches)
        return answered

    async def search(self, engine: SearchEngine, body: SearchRequest) -> list:
        loop = asyncio.get_running_loop()
        if not self.pending:
            loop.call_soon(self._answer_pending, self.WAIT_TURNS)
        future = loop.create_future()
        self.pending.append((engine, body, future))
        return await future

    def _answer_pending(self, turns_left: int) -> None:
        if turns_left:  # let the requests already read reach the batch first
            asyncio.get_running_loop().call_soon(self._answer_pending, turns_left - 1)
            return
        pending, self.pending = self.pending, []
        groups: dict[tuple, list] = {}
        for engine, body, future in pending:
            groups.setdefault((id(engine), body.k, body.mode, body.dense_weight), []).append((engine, body, future))
        for members in groups.values():
            engine, kind = members[0][0], (members[0][1].mode, False)
            if self.on_loop(engine, kind):
                answer = functools.partial(self._answers, members)
                self._settle(members, self.run_on_loop(engine, kind, answer, len(members)))
            else:
                asyncio.ensure_future(self._answer_in_thread(members))

    async def _answer_in_thread(self, members: list) -> None:
        self._settle(members, await run_in_threadpool(self._answers, members))

    @staticmethod
    def _answers(members: list) -> list:
        """Each request's hits, or the exception answering it (it never raises)."""
        engine, first, _ = members[0]
        try:
            queries = [body.q for _, body, _ in members]
            return engine.search_many(queries, first.k, first.mode, None, first.dense_weight)
        except PipelineError:  # one request's error (e.g. a blank query) must not be the others': one at a time
            pass
        except Exception as e:  # noqa: BLE001 -- a fault answers its requests (500, 503), never leaves them waiting
            return [e] * len(members)
        answers = []
        for _, body, _ in members:
            try:
                answers.append(engine.search(body.q, body.k, body.mode, None, body.dense_weight))
            except Exception as e:  # noqa: BLE001
                answers.append(e)
        return answers

    @staticmethod
    def _settle(members: list, answers: list) -> None:
        for (_, _, future), answer in zip(members, answers):
            if future.done():  # its client went away
                continue
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)
