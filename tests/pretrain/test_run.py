"""pretrain/run.py's resolve: `pipeline pretrain`'s settings become the typed parts of one job, once, before
anything is written."""

from pathlib import Path

import pytest

from common.errors import PipelineError
from common.workspace import Workspace
from pretrain.run import resolve
from pretrain.settings import PretrainSettings


def test_a_given_plan_and_length_resolve_into_the_jobs_parts(tmp_path):
    settings = PretrainSettings(
        data=[Path("docs")], nproc=2, strategy="ddp", max_steps=7, n_layer=3, n_embd=48, n_head=4, seed=5
    )
    job = resolve(Workspace(tmp_path / "ws"), settings, budget_s=30.0)
    assert job.placement.world == 2 and job.placement.launch_args()["nproc"] == 2
    assert job.plan is not None and job.plan.dp == 2
    assert job.config.max_steps == 7 and (job.config.model.n_layer, job.config.model.n_embd) == (3, 48)
    assert job.sources.paths == (Path("docs"),) and job.data.seed == 5
    assert job.budget_s == 30.0 and not job.sized and job.steps_given and job.resume_from is None
    assert not (tmp_path / "ws").exists()  # resolving writes nothing


def test_without_a_shape_or_length_the_job_is_sized_and_the_planner_may_choose(tmp_path):
    job = resolve(Workspace(tmp_path / "ws"), PretrainSettings(strategy="auto", nproc=1, time_budget="90s"))
    assert job.sized and job.vocab_size == 0 and job.plan is None and job.budget_s == 90.0


def test_how_settings_combine_is_checked_when_resolving(tmp_path):
    with pytest.raises(PipelineError, match="--strategy auto chooses the degrees"):
        resolve(Workspace(tmp_path / "ws"), PretrainSettings(strategy="auto", dp=2))
    with pytest.raises(PipelineError, match="--resume: no checkpoint"):
        resolve(Workspace(tmp_path / "ws"), PretrainSettings(resume=True))
