"""`soak-sidecar report` on a real local run: the page, opened in headless Chromium (Debian's
`chromium`), has a drawn path for every series and the plots show in a screenshot; and the odd
inputs a report can meet (a truncated samples file, a stray symlink, not an artifact)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from sidecar.core.report import COLORS
from tests.components import require
from tests.fixtures.processes import Spawner
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def soak(tmp_path: Path) -> Path:
    """A local run whose RSS grows; returns its attempt directory."""
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--output", str(tmp_path / "out"),
        "--run-dir", str(tmp_path / "run"), "--progress-dir", str(tmp_path / "progress"),
        "--deadline-dir", str(tmp_path / "deadlines"), "--gpu-backend", "none", "--status", "off",
        "--sample-interval", "0.1", "--post-shutdown-grace", "0.1",
        "--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "20", "--step-s", "0.1",
        "--leak-rss", "4",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (attempt,) = (tmp_path / "out" / "runs").glob("*/attempt-1")
    return attempt


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def browser() -> str:
    return str(require("browser"))


def chromium(*args: str) -> subprocess.CompletedProcess[bytes]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]
    return subprocess.run([browser(), *flags, *args], capture_output=True, timeout=120, check=False)


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of an 8-bit RGB(A) non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        chunk = png[pos + 8 : pos + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6)
    channels = 3 if color == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytes(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = previous[i], previous[i - channels] if i >= channels else 0
            predictor = (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]
            line[i] = (line[i] + predictor) & 0xFF
        rows.append(bytes(line))
        previous = bytes(line)
    return width, channels, rows


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def test_the_report_opens_in_chromium_with_every_series_drawn(tmp_path: Path) -> None:
    attempt = soak(tmp_path)
    done = report(str(attempt))
    assert done.returncode == 0, done.stderr
    page = attempt / "report.html"
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text and "<link" not in text  # self-contained: nothing runs, nothing fetched
    # The whole run in words: how the trainer ended, its command, its console's tail, and the leak
    # that passed (leak rules are opt-in) pointed out.
    assert "exited with code 0" in text and "sidecar.examples.trainer --steps 20" in text
    assert "<h2>Console (last lines)</h2><pre>" in text
    assert "a leak rule would have failed it" in text
    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    paths = re.findall(r'<path class="series" data-series="([^"]+)" d="([^"]*)"', dom.stdout.decode())
    drawn = {name: len(re.findall(r"[ML]", d)) for name, d in paths}
    assert {"RSS", "processes", "zombies", "bytes", "left"} <= set(drawn), drawn
    assert all(points >= 2 for points in drawn.values()), drawn
    shot = tmp_path / "report.png"
    done_shot = chromium("--window-size=1000,1400", f"--screenshot={shot}", page.as_uri())
    assert done_shot.returncode == 0 and shot.is_file(), done_shot.stderr.decode(errors="replace")[-2000:]
    width, channels, rows = png_pixels(shot.read_bytes())
    first_color = bytes(int(COLORS[0][i : i + 2], 16) for i in (1, 3, 5))
    coloured = sum(
        1 for row in rows for x in range(width) if row[x * channels : x * channels + 3] == first_color
    )
    assert coloured > 200, "the plots' lines are not on the screenshot"


def test_a_report_of_a_truncated_samples_file_says_how_much_it_skipped(tmp_path: Path) -> None:
    attempt = soak(tmp_path)
    samples = attempt / "samples.jsonl.gz"
    whole = gzip.decompress(samples.read_bytes())
    samples.write_bytes(gzip.compress(whole + b"{not json\n")[:-12])  # a bad line, then cut short
    done = report(str(attempt / "artifact.json"), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    assert "unreadable sample lines skipped" in done.stderr and (tmp_path / "r.html").stat().st_size > 1000


def test_odd_inputs_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "not.json").write_text("[1, 2]", encoding="utf-8")
    done = report(str(tmp_path / "not.json"))
    assert done.returncode == 64 and "not a soak-sidecar artifact" in done.stderr
    os.symlink("/etc/passwd", tmp_path / "artifact.json")
    done = report(str(tmp_path))
    assert done.returncode == 64 and "cannot read" in done.stderr and "Traceback" not in done.stderr
    done = report(str(tmp_path / "missing"))
    assert done.returncode == 64 and done.stderr.count("\n") == 1


def attempt_dir(directory: Path, artifact: str) -> Path:
    """An attempt directory with ``artifact`` as its artifact.json and two samples."""
    directory.mkdir(exist_ok=True)
    (directory / "artifact.json").write_text(artifact, encoding="utf-8")
    lines = [json.dumps({"t_wall": 1_700_000_000 + n, "process": {"rss_kib_total": 1024}}) for n in (0, 1)]
    (directory / "samples.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    return directory


DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "1" + "0" * 400


def with_deadline(deadline: str) -> str:
    """An artifact, its deadline section as JSON text."""
    head = '{"status": "failed", "samples": {"samples_file": "samples.jsonl.gz"}, "deadline": '
    return head + deadline + "}"


@pytest.mark.parametrize(
    ("deadline", "said"),
    [
        ('{"deadline_unix": NaN}', "is not valid JSON: NaN is not a finite number"),
        ('{"deadline_unix": Infinity}', "is not valid JSON: Infinity is not a finite number"),
        ('{"deadline_unix": 1e999}', "deadline.deadline_unix must be a number from 0 to"),
        ('{"deadline_unix": ' + HUGE + "}", "deadline.deadline_unix must be a number from 0 to"),
        ('{"deadline_unix": "tomorrow"}', "deadline.deadline_unix must be a number from 0 to"),
        ("[1700000000]", "deadline must be an object, got a list"),
        (DEEP, "is nested too deeply to parse"),
    ],
    ids=["nan", "infinity", "1e999", "10**400", "string", "list", "deep"],
)
def test_a_malformed_artifact_is_one_usage_error_line(tmp_path: Path, deadline: str, said: str) -> None:
    attempt = attempt_dir(tmp_path / "attempt", with_deadline(deadline))
    done = report(str(attempt), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 64, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("soak-sidecar: error: "), done.stderr
    assert said in done.stderr and not (tmp_path / "r.html").exists()


def test_malformed_samples_are_skipped_and_counted(tmp_path: Path) -> None:
    attempt = attempt_dir(tmp_path / "attempt", with_deadline('{"deadline_unix": 1700000100}'))
    good = gzip.decompress((attempt / "samples.jsonl.gz").read_bytes())
    bad = [
        '{"t_wall": NaN}',
        '{"t_wall": 1e999}',
        '{"t_wall": ' + HUGE + "}",
        '{"t_wall": "now"}',
        '{"t_wall": 1700000000, "process": [1]}',
        '{"t_wall": 1700000000, "gpu": {"devices": {"0": 1}}}',
        '{"t_wall": 1700000000, "x": ' + DEEP + "}",
        '{"t_wall": 1700000000, "x": "' + "y" * (5 * 1024 * 1024) + '"}',  # over the line bound
    ]
    (attempt / "samples.jsonl.gz").write_bytes(gzip.compress(good + "\n".join(bad).encode() + b"\n" + good))
    done = report(str(attempt), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "(8 unreadable sample lines skipped)" in done.stderr, done.stderr


@pytest.mark.parametrize("link", ["symlink", "dangling symlink", "hard link"])
def test_the_page_is_never_written_through_a_link(tmp_path: Path, link: str) -> None:
    attempt = attempt_dir(tmp_path / "attempt", with_deadline("null"))
    victim = tmp_path / "victim"
    victim.write_text("precious", encoding="utf-8")
    if link == "hard link":
        os.link(victim, attempt / "report.html")
    else:
        os.symlink(victim if link == "symlink" else tmp_path / "absent", attempt / "report.html")
    for argv in ([str(attempt)], [str(attempt), "-o", str(attempt / "report.html")]):
        done = report(*argv)
        assert done.returncode == 64, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("soak-sidecar: error: cannot write ")
    assert victim.read_text(encoding="utf-8") == "precious" and not (tmp_path / "absent").exists()
    (attempt / "report.html").unlink()
    assert report(str(attempt)).returncode == 0 and (attempt / "report.html").stat().st_size > 1000


def test_a_runs_page_shows_every_attempt_and_where_the_budget_went(tmp_path: Path, spawn: Spawner) -> None:
    """Attempt 1 stopped from outside (SIGTERM: a soft stop, the example trainer checkpoints), attempt 2
    resumes the same run and passes: one page for both, each linked to its own, in headless Chromium."""
    run_id = "2f6e1a3b-8c4d-4e5f-9a0b-1c2d3e4f5a6b"
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--run-id", run_id,
        "--output", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"),
        "--progress-dir", str(tmp_path / "progress"),
        "--deadline-dir", str(tmp_path / "deadlines"), "--gpu-backend", "none", "--status", "off",
        "--sample-interval", "0.1", "--post-shutdown-grace", "0.1", "--stop-grace", "5",
        "--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "25", "--step-s", "0.1",
    ]  # fmt: skip
    first = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = tmp_path / "out" / "runs" / run_id
    samples = runs / "attempt-1" / "samples.jsonl.gz"

    def productive_samples() -> int:  # samples taken once the trainer made progress
        if not samples.is_file():
            return 0
        text = zlib.decompressobj(wbits=31).decompress(samples.read_bytes()).decode()
        lines = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
        return sum(1 for line in lines if line.get("progress", {}).get("bytes_total", 0) > 0)

    wait_until("five samples of progress in attempt 1", lambda: productive_samples() >= 5, 60)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 17
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    done = report(str(runs))
    assert done.returncode == 0, done.stderr
    page = (runs / "report.html").read_text()
    assert f"soak {run_id}: 2 attempts" in page and "goodput" in page
    assert "external_cancellation" in page and page.count("<rect ") >= 6
    for attempt in ("attempt-1", "attempt-2"):
        assert f'<a href="./{attempt}/report.html">' in page and (runs / attempt / "report.html").is_file()
    dom = chromium("--dump-dom", (runs / "report.html").as_uri())
    assert dom.returncode == 0 and b"Where the budget went" in dom.stdout
    # The run's ledger lists both; the checkpoint of the soft stop counts (no lost work guessed).
    ledger = json.loads((runs / "ledger.json").read_text())
    stopped, resumed = ledger["attempts"]
    assert (stopped["classification"], stopped["lost_work_known"], resumed["status"]) == (
        "external_cancellation",
        True,
        "passed",
    ), stopped
    assert f"goodput {ledger['budget']['goodput']:.1%}" in page


SAMPLES = "samples.jsonl.gz"


def hot_attempt(directory: Path) -> Path:
    """A minute of samples; from 0:00:20 to 0:00:40 GPU 0 is in sw_thermal and the trainer makes 4
    steps/s instead of 10. GPU 0 is otherwise idle, GPU 1 at its application clocks throughout."""
    directory.mkdir()
    artifact = {"status": "passed", "context": {"run_id": "hot"}, "samples": {"samples_file": SAMPLES}}
    (directory / "artifact.json").write_text(json.dumps(artifact), encoding="utf-8")
    lines, step = [], 0
    for n in range(61):
        hot = 20 < n <= 40
        step += 4 if hot else 10
        devices = [
            {"index": 0, "uuid": "GPU-0000", "clock_event_reasons": ["sw_thermal"] if hot else ["gpu_idle"]},
            {"index": 1, "uuid": "GPU-1111", "clock_event_reasons": ["applications_clocks"]},
        ]
        sample = {"t_wall": 1_700_000_000 + n, "gpu": {"devices": devices}, "progress": {"step": step}}
        lines.append(json.dumps(sample))
    (directory / SAMPLES).write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    return directory


def colour_runs(png: bytes, colour: str, at_least: int) -> list[list[int]]:
    """The columns of ``colour`` in each screenshot row that has at least ``at_least`` of them."""
    width, channels, rows = png_pixels(png)
    want = bytes(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    found = [[x for x in range(width) if row[x * channels : x * channels + 3] == want] for row in rows]
    return [columns for columns in found if len(columns) >= at_least]


def test_the_gpus_clock_event_reasons_line_up_under_the_throughput_in_chromium(tmp_path: Path) -> None:
    """The thermal band is drawn under the throughput, its name on it, over the same stretch of the
    time axis as the slow steps; the idle and application-clock reasons are not drawn."""
    page = hot_attempt(tmp_path / "attempt") / "report.html"
    done = report(str(page.parent))
    assert done.returncode == 0, done.stderr
    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    text = dom.stdout.decode()
    assert text.index('data-series="steps/s"') < text.index('aria-label="GPU clock-event reasons"')
    assert ">sw_thermal (thermal)</text>" in text and "sw_thermal (thermal): the driver slows" in text
    assert 'data-reason="gpu_idle"' not in text and 'data-reason="applications_clocks"' not in text
    ((x, width),) = re.findall(r'data-reason="sw_thermal" x="([\d.]+)" y="\d+" width="([\d.]+)"', text)
    left, right = float(x), float(x) + float(width)
    # The throughput's points (one per sample): the slow ones lie over the band, the others off it.
    (d,) = re.findall(r'data-series="steps/s" d="([^"]*)"', text)
    points = [(float(px), float(py)) for px, py in re.findall(r"[ML]([\d.]+) ([\d.]+)", d)]
    slow_y = max(py for _, py in points)  # 4 steps/s: the lowest on the plot
    slow = [px for px, py in points if py == slow_y]
    assert len(slow) == 20 and left < min(slow) and max(slow) == pytest.approx(right, abs=0.2), slow
    assert not [px for px, py in points if py != slow_y and left + 0.5 < px < right - 0.5]
    # On the screenshot the band's colour fills that stretch (the page has a 24 px margin).
    shot = tmp_path / "report.png"
    done_shot = chromium("--window-size=1000,2400", f"--screenshot={shot}", page.as_uri())
    assert done_shot.returncode == 0 and shot.is_file(), done_shot.stderr.decode(errors="replace")[-2000:]
    band = colour_runs(shot.read_bytes(), "#ff7f0e", at_least=100)
    assert band, "the sw_thermal band is not on the screenshot"
    assert min(band[0]) == pytest.approx(24 + left, abs=1.5), (band[0][0], left)
    assert max(band[0]) + 1 == pytest.approx(24 + right, abs=1.5), (band[0][-1], right)
