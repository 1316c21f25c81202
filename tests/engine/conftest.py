"""Fixtures shared by the engine tests; pytest finds them here, test modules do not import
them. Plain helper functions are in helpers.py.

Ray: one in-process cluster serves every engine test that asks for `cluster` (a start
costs seconds, and its first actors more). It starts with the first test that asks and
stops after the last engine test, so it never runs beside the Ray heads that the
integration tests and bench scripts of the same process start. Under pytest-xdist each
worker has its own (`address="local"`: a new cluster on free ports). It declares GPUS
GPUs, which this host need not have: runs placed on GPUs (placement.devices "gpu") get
Ray's GPU ids and CUDA_VISIBLE_DEVICES, and compute on the CPU where torch sees no GPU.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import ray
import torch

from tests.engine.helpers import TOKEN, small_config
from tests.engine.ingest_stub import IngestStub
from tests.xdist_worker import ray_start_lock
from workers.core.run_actors import NAMESPACE, kill_named
from workers.model.loading import build_tiny, save_model
from workers.model.tokenizer import CharTokenizer

HERE = Path(__file__).parent
GPUS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """In-process Ray, started on first use and kept for the following modules. After each
    module the named actors it left in the run namespace are killed: a run that a failed
    test left behind would otherwise hold CPUs and memory in the next module's cluster."""
    if not ray.is_initialized():
        with ray_start_lock(tmp_path_factory):
            # address="local": a cluster of our own even where RAY_ADDRESS or a `ray start`
            # on this machine names another one.
            ray.init(
                address="local",
                num_cpus=2,
                num_gpus=GPUS,
                include_dashboard=False,
                namespace=NAMESPACE,
                log_to_driver=False,
            )
    yield
    if ray.is_initialized():
        kill_named([a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE])


@pytest.hookimpl(trylast=True)  # after pytest has torn down the fixtures `nextitem` lacks
def pytest_runtest_teardown(item, nextitem):
    """Stop Ray once the next test is not an engine test (or there is none)."""
    if ray.is_initialized() and (nextitem is None or HERE not in nextitem.path.parents):
        ray.shutdown()


@pytest.fixture
def stub():
    """The platform's ingest endpoints, expecting helpers.TOKEN."""
    with IngestStub(token=TOKEN) as s:
        yield s


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A randomly initialised tiny Llama with sharpened weights (so sampling is not uniform)
    and an EOS bias (so some completions stop early)."""
    cfg = small_config()
    tokenizer = CharTokenizer()
    model = build_tiny(cfg.model, tokenizer, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4)
        model.lm_head.weight[tokenizer.eos_id] += 0.5 * model.model.norm.weight
    path = str(tmp_path_factory.mktemp("tiny-model"))
    save_model(model, tokenizer, path)
    return path


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """`checkpoints(arch)`: one tiny checkpoint per architecture of workers.model.tiny_hf, made
    on first use and shared by every test that only reads it."""
    from workers.model.tiny_hf import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("archs")
    made: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in made:
            made[arch] = make_tiny_checkpoint(str(root / arch), arch)
        return made[arch]

    return get


@pytest.fixture
def one_torch_thread():
    """In-process training and sampling on one torch thread: on the shared 2-core host two
    intra-op threads spin against each other and against the Ray actors (a 60-step warm
    start took minutes instead of seconds)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def _flask_app():
    import flask

    return flask.Flask("rollway-tests")


@pytest.fixture(autouse=True)
def flask_contexts_for_vllms_kernel_scan():
    """vLLM-CPU, starting an engine in this process, scans every attribute of every loaded
    module (vllm.triton_utils.dispatcher._rebind_kernels), and Flask's request/app proxies
    raise RuntimeError outside a context instead of AttributeError. Flask is in the test
    process once schemathesis (the OpenAPI fuzz) finds it installed (mlflow's install
    brings it) and loads it, which a worker may do between two engine tests; the engine's
    own processes (Ray actors) never import it. So each engine test runs in a context
    while Flask is loaded."""
    import sys

    if "flask" not in sys.modules:
        yield
        return
    with _flask_app().test_request_context():
        yield
