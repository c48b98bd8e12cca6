"""`pipeline serve --ray ADDRESS`: a sharded index (`pipeline index --shards N`) served by Ray Serve.

Each shard is a Ray Serve application of its own, `shard-<its build>-<i>`, one deployment (ShardReplica, replicas
as asked) holding the shard's IndexShard: its FAISS and BM25 indexes and its corpus snapshot, memory-mapped
from the workspace (every node must read the workspace at the same path: a shared file system). The ingress is
the application `search`, routed at `/`: the same FastAPI app as `pipeline serve` (search/serve/app.py), whose
engine embeds the query once and asks each shard through a RemoteShard, a DeploymentHandle behind the engine's
Shard interface: every shard's call is made before any answer is awaited, the rankings are
merged and fused in the ingress (search/engine.py), so the answers are those of one machine.

Faults. Ray Serve restarts a replica that dies, and sends requests to a shard's other replicas meanwhile. A
call that fails or does not answer within SHARD_TIMEOUT_S fails its request with a 503 naming the shard
(ShardUnavailable): never an answer from the other shards alone.

Reloads. This process (the driver) watches the manifest. When `pipeline index` has written a new index, it
deploys the new build's shard applications beside the old ones; only when every one of them is running does it
tell the ingress to load the new index (Generation.check); the old ones are deleted SHARD_TIMEOUT_S later,
when the requests still asking them are answered. A shard that fails to start, or an ingress that cannot load
the new index, deletes the new ones: every shard is swapped, or none.

Writes. The document API runs in the ingress, and updates only the shards the documents belong to
(index/shards.py update_shards): the others keep their build, so their applications go on serving, and only
the updated shards are deployed anew; the write answers once the driver has had the ingress load the result
(Generation.wait_until_served).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ray import serve
from ray.exceptions import RayTaskError

from common.console import info, warn
from common.errors import PipelineError
from common.lexical import CollectionStatistics
from common.manifest import IndexEntry, read_manifest
from common.ray_cluster import connect, notices_on_stderr
from common.workspace import Workspace
from search.engine import Hit, IndexShard, Ranking, ShardUnavailable
from search.serve.generation import POLL_SECONDS, WriteDocuments

INGRESS = "search"  # the ingress application's name
SHARD_TIMEOUT_S = 30.0  # how long the ingress waits for a shard's answer before failing the request (503)
# Ray's CPUs reserved for a replica: where it is placed, not what it may use (a shard's searches use a thread per
# core of its node). Small, so that a new index's shards fit beside the old ones while they are swapped.
SHARD_CPUS = 0.25
INGRESS_CPUS = 0.25
# Requests the ingress takes at once (Ray Serve's default is 5): its batcher answers the searches that arrive
# together with one call to each shard, and with 5 at a time the proxy held the rest back.
INGRESS_ONGOING_REQUESTS = 64
DEPLOY_TIMEOUT_S = 600.0  # a new index's shards all running (their replicas placed and their indexes loaded)
DELETE_TIMEOUT_S = 60.0  # applications deleted (their replicas stopped), as Ray Serve's own serve.delete waits
RETRY_REFUSED_S = 30.0  # a new index that could not be served is tried again after this (each try starts replicas)
QUIET = {"log_level": "WARNING", "enable_access_log": False}  # Ray Serve's logging: what goes wrong, not each call


def shard_application(build_id: str, number: int) -> str:
    return f"shard-{build_id}-{number}"


# A replica whose shard cannot load (a file missing or damaged) fails the same way each time: give up at the first
# failure (Ray Serve's default is 20 tries), so that a new index that cannot be served is said, and dropped, quickly.
# The driver tries a refused index again RETRY_REFUSED_S later (RayServing.poll): the retry a passing fault needs.
CONSTRUCTOR_TRIES = 1


@serve.deployment(
    ray_actor_options={"num_cpus": SHARD_CPUS},
    health_check_period_s=2,
    health_check_timeout_s=10,
    max_constructor_retry_count=CONSTRUCTOR_TRIES,
)
class ShardReplica:
    """One replica of a shard: its IndexShard, answering the engine's Shard calls (search/engine.py)."""

    def __init__(self, root: str, entry: IndexEntry, number: int, build_id: str):
        import faiss

        faiss.omp_set_num_threads(1)  # a query's FAISS search is small: one thread (as run_server sets)
        self.shard = IndexShard(Path(root), entry, number)
        self.identity = (build_id, number)

    def statistics(self, query: str) -> CollectionStatistics:
        return self.shard.statistics(query)

    def candidates(self, *arguments) -> tuple[list[Ranking] | None, list[Ranking] | None]:
        return self.shard.candidates(*arguments)

    def hits(self, query: str, ranking: Ranking) -> list[Hit]:
        return self.shard.hits(query, ranking)

    def document(self, doc_id: str) -> dict | None:
        return self.shard.document(doc_id)

    def fields(self) -> dict[str, str]:
        return self.shard.fields()

    def describe(self) -> tuple[str, int]:
        """(the index build, the shard's number) this replica answers for."""
        return self.identity


class RemoteShard:
    """Shard `number` of the index `build_id`, answering from its Ray Serve application: the engine's Shard
    interface (search/engine.py), each call a request through a DeploymentHandle, awaited by its RemoteAnswer."""

    def __init__(self, build_id: str, number: int):
        self.number = number
        self.application = shard_application(build_id, number)
        try:
            self.handle = serve.get_app_handle(self.application)
        except Exception:  # noqa: BLE001 -- Ray Serve raises several kinds for an application it does not have
            raise PipelineError(f"shard {number} of index {build_id} is not deployed ({self.application})") from None
        described = RemoteAnswer(self, self.handle.describe.remote()).result()
        if tuple(described) != (build_id, number):  # never an answer from another index's shard
            raise PipelineError(f"{self.application} answers for {described}, not shard {number} of {build_id}")

    def statistics(self, query: str) -> RemoteAnswer:
        return RemoteAnswer(self, self.handle.statistics.remote(query))

    def candidates(self, *arguments) -> RemoteAnswer:
        return RemoteAnswer(self, self.handle.candidates.remote(*arguments))

    def hits(self, query: str, ranking: Ranking) -> RemoteAnswer:
        return RemoteAnswer(self, self.handle.hits.remote(query, ranking))

    def document(self, doc_id: str) -> RemoteAnswer:
        return RemoteAnswer(self, self.handle.document.remote(doc_id))

    def fields(self) -> RemoteAnswer:
        return RemoteAnswer(self, self.handle.fields.remote())


class RemoteAnswer:
    """A RemoteShard's answer: the replica's result, its own error (a request's, such as a filter's field) or
    ShardUnavailable naming the shard."""

    def __init__(self, shard: RemoteShard, response):
        self.number, self.application, self.response = shard.number, shard.application, response

    def result(self):
        try:
            return self.response.result(timeout_s=SHARD_TIMEOUT_S)
        except RayTaskError as e:  # the shard raised: a request's own error (a filter's field) is the caller's
            if isinstance(e.cause, PipelineError):
                raise e.cause from None
            raise ShardUnavailable(
                f"shard {self.number} ({self.application}) failed: {type(e.cause).__name__}"
            ) from None
        except Exception as e:  # noqa: BLE001 -- a replica gone, a timeout: Ray Serve's kinds
            raise ShardUnavailable(
                f"shard {self.number} ({self.application}) did not answer ({type(e).__name__}); try again"
            ) from None


def remote_shards(root: Path, entry: IndexEntry) -> list[RemoteShard]:
    """The index's shards as deployed by `serve_on_ray` (search.engine.OpenShards)."""
    return [RemoteShard(shard.build_id, number) for number, shard in enumerate(entry.shard_entries())]


@serve.deployment(ray_actor_options={"num_cpus": INGRESS_CPUS}, max_ongoing_requests=INGRESS_ONGOING_REQUESTS)
@serve.ingress()
class Ingress:
    """The HTTP API of `pipeline serve`, its engine asking the shards' applications."""

    def __init__(self, root: str, api_key: str | None, write_documents: WriteDocuments):
        import torch

        from search.serve.app import create_app  # here: a shard's replica has no use for the HTTP app

        torch.set_num_threads(1)  # as run_server: a query is a few tokens
        # Ray Serve runs this on the replica's event loop, where a shard's answer cannot be waited for: the app
        # (whose engine asks each shard which index it holds) is made on a thread of its own.
        with ThreadPoolExecutor(1) as thread:
            self.http_app = thread.submit(
                create_app, Workspace(root), write_documents, api_key, poll_seconds=None, open_shards=remote_shards
            ).result()

    def __serve_build_asgi_app__(self):
        return self.http_app

    def reload(self) -> str:
        """Load the index the manifest names now (its shards deployed); returns the build then served."""
        generation = self.http_app.state.generation
        generation.check(raise_errors=True)
        return generation.current().index_entry.build_id


def deploy_shards(
    root: Path, entry: IndexEntry, replicas: int, running: list[str] = (), timeout_s: float = DEPLOY_TIMEOUT_S
) -> list[str]:
    """Deploy every shard of the index `entry` that is not `running` already (a shard a write left as it was) as
    an application, side by side, and wait until they all run; all of them or, when one fails or they are not
    all running within timeout_s (e.g. the cluster lacks the CPUs to place them), none: the new ones are
    deleted. Returns the names of all its shards' applications."""
    shards = entry.shard_entries()
    names = [shard_application(shard.build_id, number) for number, shard in enumerate(shards)]
    new = [(number, name) for number, name in enumerate(names) if name not in running]
    deployment = ShardReplica.options(name="shard", num_replicas=replicas)
    serve.run_many(
        [
            serve.RunTarget(
                deployment.bind(str(root), shards[number], number, shards[number].build_id),
                name=name,
                route_prefix=None,
                logging_config=QUIET,
            )
            for number, name in new
        ],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
    deadline = time.monotonic() + timeout_s
    problem = None
    while problem is None:
        statuses = serve.status().applications
        states = [statuses[name] if name in statuses else None for name in names]
        if all(state is not None and state.status == "RUNNING" for state in states):
            return names
        failed = [(n, state) for n, state in enumerate(states) if state is not None and state.status == "DEPLOY_FAILED"]
        if failed:
            number, state = failed[0]
            problem = f"shard {number} of index {entry.build_id} did not start: {start_failure(state)}"
        elif time.monotonic() > deadline:
            problem = f"the shards of index {entry.build_id} were not all running after {timeout_s:.0f} s"
        time.sleep(0.5)
    delete_applications([name for _, name in new])
    raise PipelineError(problem)


def start_failure(application) -> str:
    """Why an application failed to deploy, in a line: its replica's error (e.g. a shard's file missing, named), not
    the application's own message, which says only that its deployment failed."""
    said = [d.message for d in application.deployments.values() if d.message] + [application.message]
    return last_line(said[0])


def delete_applications(names: list[str]) -> None:
    """Delete Ray Serve applications, all at once (one by one, each waits for its replicas to stop)."""
    for name in names:
        serve.delete(name, _blocking=False)
    deadline, left = time.monotonic() + DELETE_TIMEOUT_S, names
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        applications = serve.status().applications  # one call a round: it asks Ray Serve's controller
        left = [name for name in left if name in applications]
    if left:
        warn(f"Ray Serve had not deleted {', '.join(left)} after {DELETE_TIMEOUT_S:.0f} s")


def last_line(error: Exception | str) -> str:
    """The last line of an error that may carry a remote traceback: what it says went wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


class RayServing:
    """The driver's side of `pipeline serve --ray`: the index's shards and the ingress deployed on Ray Serve,
    and a new index swapped in, all its shards or none (`poll`)."""

    def __init__(
        self,
        ws: Workspace,
        api_key: str | None,
        write_documents: WriteDocuments,
        replicas: int,
        retire_after: float = SHARD_TIMEOUT_S,
        retry_refused_after: float = RETRY_REFUSED_S,
    ):
        self.ws, self.api_key, self.write_documents = ws, api_key, write_documents
        self.replicas, self.retire_after, self.retry_refused_after = replicas, retire_after, retry_refused_after
        self.refused: tuple[str, float] | None = None  # (a new index that could not be served, when to try it again)
        self.retiring: list[tuple[float, list[str]]] = []  # (when, old shards): requests asking them finish first

    def start(self, host: str, port: int) -> None:
        """Deploy the shards of the index the manifest names, then the ingress, serving http://host:port/."""
        entry = read_manifest(self.ws).index
        if entry is None:
            raise PipelineError(
                f"workspace {self.ws.root} has no index: run `pipeline embed` and `pipeline index` first"
            )
        serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port}, logging_config=QUIET)
        self.served, self.entry = deploy_shards(self.ws.root, entry, self.replicas), entry
        try:
            serve.run(
                Ingress.options(name="ingress").bind(str(self.ws.root), self.api_key, self.write_documents),
                name=INGRESS,
                route_prefix="/",
                logging_config=QUIET,
            )
        except Exception as e:  # noqa: BLE001 -- as in deploy_shards
            self.stop()
            raise PipelineError(f"the ingress did not start: {last_line(e)}") from None
        self.ingress = serve.get_app_handle(INGRESS)

    def poll(self) -> bool:
        """Delete the shards retired long enough ago; when the manifest names a new index, deploy its shards and
        have the ingress load it. True when it did; a new index that cannot be served is said, and the old one
        kept (with its shards) until the new one is tried again, retry_refused_after seconds later."""
        now = time.monotonic()
        delete_applications([name for when, names in self.retiring if when <= now for name in names])
        self.retiring = [(when, names) for when, names in self.retiring if when > now]
        latest = read_manifest(self.ws).index
        if latest is None or latest.build_id == self.entry.build_id:
            return False
        if self.refused is not None and self.refused[0] == latest.build_id and now < self.refused[1]:
            return False
        try:
            names = deploy_shards(self.ws.root, latest, self.replicas, running=self.served)
        except PipelineError as e:
            return self.refuse(latest, str(e))
        try:
            loaded = self.ingress.reload.remote().result()
        except Exception as e:  # noqa: BLE001 -- the ingress's error, through Ray
            loaded = f"not loaded ({last_line(e)})"
        if loaded != latest.build_id:  # the ingress kept the old index: so do its shards
            delete_applications(sorted(set(names) - set(self.served)))
            return self.refuse(latest, f"the ingress did not load {latest.build_id}: {loaded}")
        self.retiring.append((time.monotonic() + self.retire_after, [n for n in self.served if n not in names]))
        self.served, self.entry = names, latest
        info(f"loaded the rebuilt index {latest.build_id} ({latest.vectors} vectors)")
        return True

    def refuse(self, latest: IndexEntry, why: str) -> bool:
        """Keep serving the index served, say why the new one is not, and try it again later, not at every poll:
        each try starts its shards' replicas. False: not loaded."""
        self.refused = (latest.build_id, time.monotonic() + self.retry_refused_after)
        warn(f"keeping index {self.entry.build_id}: {why} (trying it again in {self.retry_refused_after:.0f} s)")
        return False

    def stop(self) -> None:
        """Delete every application deployed."""
        delete_applications([INGRESS, *self.served, *(name for _, names in self.retiring for name in names)])
        self.retiring = []


def serve_on_ray(
    ws: Workspace,
    address: str,
    host: str,
    port: int,
    api_key: str | None,
    write_documents: WriteDocuments,
    replicas: int,
) -> None:
    """Serve the workspace's index on the Ray cluster at `address` until interrupted (module docstring)."""
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    connect(address)
    serving = RayServing(ws, api_key, write_documents, replicas)
    with notices_on_stderr():
        try:
            serving.start(host, port)
            shards = len(serving.entry.shard_entries())
            info(f"serving {ws.root} on http://{host}:{port}/ from Ray Serve: {shards} shards x {replicas} replicas")
            while True:
                time.sleep(POLL_SECONDS)
                serving.poll()
        finally:
            serve.shutdown()
