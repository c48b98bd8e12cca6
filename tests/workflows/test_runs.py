"""The runs page of `pipeline serve` (/runs, its JSON at /runs.json): a real sized pretraining run with a plan
prediction and the adaptation, served by a real server, drawn in a real headless browser with no network."""

from __future__ import annotations

import json
import statistics
import subprocess
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import ONE_AT_A_TIME, board, read_metrics, run_cli
from embed.settings import TuneSettings
from pretrain.sizing import LAW_GAIN
from server import running_server
from workflows import MIN_ADAPTATION_SHARE, PRETRAIN_SHARE

KEY = "test-key-0123456789"
CHROMIUM = Path("/usr/bin/chromium")
PLOTLY_BLUE, PLOTLY_ORANGE = (31, 119, 180), (255, 127, 14)  # plotly's first two trace colours
# The chain here is sized to a budget, so how many steps it trains depends on the machine's load: it runs with
# the tests that start many processes, one at a time, never beside one of them (conftest.py). A pretraining
# slowed down by the tests beside it runs over its share; the adaptation then gets the least share, which at 25 s
# was one step (seen in a fresh clone's run): 40 s leave it several.
BUDGET_S = 40
pytestmark = pytest.mark.xdist_group(ONE_AT_A_TIME)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, corpus_file) -> Path:
    """The chain as a user runs it, on the SciFact slice: pretraining sized to a budget (the sizing table),
    trained with the planner's plan for this machine (its prediction beside the measurement), adapted to
    retrieval (the adaptation's loss and candidates), then embed and index (the default-mode measurement).
    The session's trained_workspace has none of the first three (a given shape, no plan, --no-adapt)."""
    ws = tmp_path_factory.mktemp("runs") / "ws"
    pretrained = run_cli(
        "pretrain",
        "-w",
        str(ws),
        "--data",
        str(corpus_file),
        "--time-budget",
        f"{BUDGET_S}s",
        "--strategy",
        "auto",
        "--log-every",
        "1",
        "--eval-every",
        "3",
        "--json",
    )
    (ws.parent / "pretrain.json").write_text(pretrained.stdout)
    run_cli("embed", "-w", str(ws))
    run_cli("index", "-w", str(ws))
    return ws


def test_the_chain_says_how_its_budget_went_to_pretraining_and_the_adaptation(full_run):
    """Pretraining is planned in a share of the budget; what it leaves (stopped early, or a corpus worth fewer
    epochs) goes to the adaptation, and the summary says how much and why."""
    summary = json.loads((full_run.parent / "pretrain.json").read_text())
    split, phases = summary["budget_split"], summary["phases"]
    assert split["pretraining_planned_s"] == pytest.approx(BUDGET_S * PRETRAIN_SHARE)
    assert split["pretraining_s"] == phases["pretraining"]["actual_s"]
    assert split["adaptation_s"] == phases["adaptation"]["planned_s"]
    assert split["adaptation_s"] == pytest.approx(
        max(BUDGET_S - split["pretraining_s"], BUDGET_S * MIN_ADAPTATION_SHARE)
    )
    left = split["pretraining_planned_s"] - split["pretraining_s"]
    assert ("go to the adaptation" in split["why"]) == (left >= 1)
    if summary["stopped_early"]:
        assert f"stopped at step {summary['steps']} of {summary['planned_steps']}" in split["why"]
    # then what the adaptation took of its part, and what ended it (the manifest's record of the kept embedder)
    tuned, why = json.loads((full_run / "manifest.json").read_text())["tuned"], split["adaptation_why"]
    assert split["adaptation_took_s"] == phases["adaptation"]["actual_s"]
    assert why.startswith(f"adaptation: {split['adaptation_took_s']:.0f}s of its {split['adaptation_s']:.0f}s: ")
    if tuned["steps"] == tuned["planned_steps"] < tuned["plan"]["steps"]:
        bound = "asked for" if tuned["plan"]["steps"] == TuneSettings().steps else "the time allowed"
        assert f"the corpus gave pairs for {tuned['steps']} steps of the {tuned['plan']['steps']} {bound}" in why
    elif tuned["steps"] == tuned["planned_steps"] == tuned["plan"]["steps"]:
        assert f"ran all {tuned['steps']} steps asked for" in why or f"ran the {tuned['steps']} steps planned" in why


@pytest.fixture(scope="module")
def server(full_run):
    with running_server(full_run, "--api-key", KEY, output=subprocess.PIPE, timeout_s=180) as base:
        yield base


@pytest.fixture(scope="module")
def report(server) -> dict:
    return httpx.get(f"{server}/runs.json", headers={"X-API-Key": KEY}, timeout=60).json()


def test_runs_json_holds_the_run_as_its_files_hold_it(server, full_run, report):
    assert httpx.get(f"{server}/runs.json", timeout=60).status_code == 401  # the API key rule of /search
    metrics, manifest = read_metrics(full_run), json.loads((full_run / "manifest.json").read_text())
    train = [m for m in metrics if m["event"] == "train"]
    val = [m for m in metrics if m["event"] == "val"]
    run = report["pretraining"]
    assert run["train"] == train and run["val"] == val and len(val) >= 2 and run["resumes"] == []
    assert run["end"] == metrics[-1] and run["end"]["event"] == "end"
    assert run["model"]["final_val_loss"] == manifest["model"]["final_val_loss"] == val[-1]["val_loss"]

    # The sizing table: every shape timed, ranked 1..n by the law, one chosen (the first)
    sizing = run["sizing"]
    assert sizing == metrics[0] and sizing["event"] == "sizing"
    assert sorted(s["law_rank"] for s in sizing["shapes"]) == list(range(1, len(sizing["shapes"]) + 1))
    (chosen,) = [s for s in sizing["shapes"] if s["chosen"]]  # the first by the law, or within LAW_GAIN of it
    assert chosen["law_loss"] <= min(s["law_loss"] for s in sizing["shapes"]) + LAW_GAIN

    # The plan's prediction (the manifest's) beside what the run measured (its train records)
    prediction, plan = manifest["model"]["prediction"], run["plan"]
    assert plan["plan"] == prediction["plan"] and plan["main_cost"] == prediction["main_cost"]
    assert (
        plan["predicted_step_s"] == prediction["step_s"] and plan["predicted_peak_mem_mb"] == prediction["peak_mem_mb"]
    )
    assert plan["measured_step_s"] == statistics.median(m["measured_step_s"] for m in train)
    assert plan["measured_peak_mem_mb"] == max(m["measured_peak_mem_mb"] for m in train)
    assert plan["parallelism"] == manifest["model"]["plan"]

    # The adaptation: the kept embedder, each candidate's held-out score, each tuned one's loss curve as
    # TensorBoard's own reader reads tune's event files
    tuned, adaptation = manifest["tuned"], report["adaptation"]
    assert adaptation["kept"] == tuned["architecture"] and adaptation["candidates"] == tuned["candidates"]
    assert adaptation["candidates"]["static"]["held_out_ndcg@10"] is not None
    assert (adaptation["first_loss"], adaptation["final_loss"]) == (tuned["first_loss"], tuned["final_loss"])
    assert tuned["architecture"] in adaptation["loss"]
    for name, curve in adaptation["loss"].items():
        assert curve == [list(point) for point in board(full_run / "tensorboard" / f"tune-{name}")["train/loss"]]
    kept_curve = adaptation["loss"][tuned["architecture"]]
    assert len(kept_curve) >= 2 and kept_curve[-1][0] == tuned["steps"]
    assert kept_curve[0][1] == pytest.approx(tuned["first_loss"]) and kept_curve[-1][1] == pytest.approx(
        tuned["final_loss"]
    )

    # The default-mode measurement, as `pipeline index` recorded it
    assert report["search"] == manifest["search"] and report["search"]["chosen_by"] == "held-out corpus pairs"
    assert set(report["search"]["ndcg@10"]) == {"lexical", "dense", "hybrid"}
    assert len(report["search"]["hybrid_ndcg@10"]) > 1 and report["search"]["pairs"] > 0


# Per chart, the points plotly drew for each trace: scatter markers and bars are its `.point` elements.
DRAWN_POINTS = """() => Object.fromEntries([...document.querySelectorAll('.chart')]
  .filter(c => !c.closest('[hidden]'))
  .map(c => [c.id, [...c.querySelectorAll('.scatterlayer .trace, .barlayer .trace')]
    .map(t => t.querySelectorAll('.point').length)]))"""


@contextmanager
def offline_page(p, base: str):
    """A Chromium page that can reach the server only: every request elsewhere is aborted and recorded in
    `page.outside`; console errors and uncaught exceptions are recorded in `page.problems`."""
    if not CHROMIUM.exists():
        pytest.skip(
            "no browser: /usr/bin/chromium is missing (scripts/setup.sh installs Debian's chromium when run as root)"
        )
    browser = p.chromium.launch(
        executable_path=str(CHROMIUM),
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
    )
    try:
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        outside, problems = [], []
        server_host = urlsplit(base).hostname

        def only_the_server(route):
            if urlsplit(route.request.url).hostname == server_host:
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        context.route("**/*", only_the_server)
        page = context.new_page()
        page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.outside, page.problems = outside, problems
        yield page
    finally:
        browser.close()


def pixels(png: bytes):
    from PIL import Image

    return Image.open(BytesIO(png)).convert("RGB")


def count_colour(image, colour) -> int:
    return sum(n for n, c in image.getcolors(maxcolors=1 << 24) if c == colour)


@pytest.mark.browser
def test_runs_page_draws_every_chart_offline_in_a_real_browser(server, report, tmp_path):
    from playwright.sync_api import sync_playwright

    run, adaptation, search = report["pretraining"], report["adaptation"], report["search"]
    train, val = run["train"], run["val"]
    planned = [r for r in train if r.get("predicted_step_s") is not None]
    with sync_playwright() as p, offline_page(p, server) as page:
        page.goto(f"{server}/?api_key={KEY}")  # the search page links to the runs page, key and all
        page.click("#runs-link")
        page.wait_for_selector("body[data-charts=drawn], #status.error", timeout=60_000)
        assert page.get_attribute("body", "data-charts") == "drawn", page.inner_text("#status")
        assert page.url == f"{server}/runs?api_key={KEY}"
        # every chart drew every point of its series, as the JSON holds them
        assert page.evaluate(DRAWN_POINTS) == {
            "chart-loss": [len(train), len(val)],
            "chart-tokens": [len(train)],
            "chart-mfu": [len(train)],
            "chart-plan-step": [len(planned), len(planned)],
            "chart-plan-memory": [len(planned), len(planned)],
            "chart-adaptation": [len(curve) for curve in adaptation["loss"].values()],
            "chart-modes": [3],
            "chart-weights": [len(search["hybrid_ndcg@10"])],
        }
        assert len(planned) == len(train) > 0
        # the sizing table, a row per shape in rank order, the chosen one marked; the candidates' table
        rows = page.locator("#sizing-table tbody tr")
        assert rows.count() == len(run["sizing"]["shapes"])
        chosen_rank = next(shape["law_rank"] for shape in run["sizing"]["shapes"] if shape["chosen"])
        assert page.locator("#sizing-table tbody tr.chosen td").first.inner_text() == str(chosen_rank)
        # the exported weights are the best validation step's, and the page says which
        said = f"exported: the best validation step, {run['end']['best_step']} "
        assert said in page.inner_text("#pretraining-summary")
        kept = page.locator("#candidates-table tbody tr.chosen td").all_inner_texts()
        score = adaptation["candidates"][adaptation["kept"]]["held_out_ndcg@10"]
        assert kept[0] == adaptation["kept"] and float(kept[1]) == pytest.approx(score, rel=5e-3)
        assert f"Default: {search['default_mode']}" in page.inner_text("#search-summary")
        assert "predicted" in page.inner_text("#plan-summary") and "measured" in page.inner_text("#plan-summary")
        assert page.locator("#no-pretraining").is_hidden() and page.locator("#key-form").is_hidden()

        # The screenshot: the page is not blank, and each chart's region shows its traces' colours
        page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
        whole = pixels((tmp_path / "runs.png").read_bytes())
        assert len(whole.getcolors(maxcolors=1 << 24)) > 100
        for chart, traces in page.evaluate(DRAWN_POINTS).items():
            image = pixels(page.locator(f"#{chart}").screenshot())
            assert len(image.getcolors(maxcolors=1 << 24)) > 20, chart  # not a uniform region
            for colour in [PLOTLY_BLUE, PLOTLY_ORANGE][: len(traces)]:
                assert count_colour(image, colour) > 30, (chart, colour)

        # Without the key the page asks for it, and draws once it is given
        page.goto(f"{server}/runs")
        page.wait_for_selector("#status.error")
        assert "API key" in page.inner_text("#status") and page.locator("#key-form").is_visible()
        page.problems.clear()  # the browser reports the refused request (401) as a console error
        page.fill("#key", KEY)
        page.click("#key-form button")
        page.wait_for_selector("body[data-charts=drawn]", timeout=60_000)
        assert len(page.evaluate(DRAWN_POINTS)) == 8
        assert page.outside == [] and page.problems == []


@pytest.fixture(scope="module")
def embedded_only(tmp_path_factory, static_model, corpus_file) -> Path:
    """A workspace of embed and index only, with the session's static embedder given as --model (its server starts
    without importing sentence-transformers): no run log, no tuning."""
    ws = tmp_path_factory.mktemp("no-run") / "ws"
    run_cli(
        "embed",
        "-w",
        str(ws),
        "--data",
        str(corpus_file),
        "--model",
        str(static_model),
        "--chunk-tokens",
        "64",
        "--overlap",
        "8",
    )
    run_cli("index", "-w", str(ws))
    return ws


@pytest.mark.browser
def test_a_workspace_without_a_pretraining_run_says_so(embedded_only):
    from playwright.sync_api import sync_playwright

    with running_server(embedded_only, output=subprocess.PIPE, timeout_s=180) as base:
        report = httpx.get(f"{base}/runs.json", timeout=60).json()  # a server without a key: no key asked
        assert report["pretraining"] is None and report["adaptation"] is None
        assert report["search"]["default_mode"] in ("lexical", "dense", "hybrid")
        with sync_playwright() as p, offline_page(p, base) as page:
            page.goto(f"{base}/runs")
            page.wait_for_selector("body[data-charts=drawn], #status.error", timeout=60_000)
            assert page.get_attribute("body", "data-charts") == "drawn", page.inner_text("#status")
            assert "no pretraining run" in page.inner_text("#no-pretraining")
            assert "No embedder was tuned" in page.inner_text("#no-adaptation")
            assert page.locator("#pretraining").is_hidden() and page.locator("#adaptation").is_hidden()
            assert page.evaluate(DRAWN_POINTS) == {
                "chart-modes": [3],
                "chart-weights": [len(report["search"]["hybrid_ndcg@10"])],
            }
            assert page.inner_text("#status") == "" and page.outside == [] and page.problems == []
