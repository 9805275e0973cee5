"""The report's plots of the trainer's progress records (pure): its step, and between two samples
its throughput (steps, samples and tokens per second); its step time between the samples at which
a step was first seen (as sidecar.core.eta times it: a step longer than the sample interval is not
one interval). Drawn only for a trainer that writes records; a figure it never counted gets no plot."""

from __future__ import annotations

from sidecar.core.report_axes import Plot
from sidecar.core.report_samples import ReportSample

THROUGHPUT = "Throughput"


class ProgressPlots:
    """Fed one sample at a time (a long soak has tens of thousands), in time order."""

    def __init__(self) -> None:
        self._steps = Plot("Training step (progress records)", "step")
        self._rate = Plot(THROUGHPUT, "steps/s")
        self._step_time = Plot("Step time", "s/step")
        self._samples = Plot("Samples per second", "samples/s")
        self._tokens = Plot("Tokens per second", "tokens/s")
        self._last: ReportSample | None = None
        # (time, step) of the sample at which the current step was first seen.
        self._step_base: tuple[float, float] | None = None

    def add(self, t: float, sample: ReportSample) -> None:
        if sample.step is None:
            return
        last, self._last = self._last, sample
        self._steps.series.setdefault("step", []).append((t, sample.step))
        self._add_step_time(t, sample.step)
        if last is None or last.step is None or t <= last.t_wall or sample.step < last.step:
            return  # the first record, or a count that went back: no rate between the two
        span = t - last.t_wall
        self._rate.series.setdefault("steps/s", []).append((t, (sample.step - last.step) / span))
        for plot, now, before in (
            (self._samples, sample.samples, last.samples),
            (self._tokens, sample.tokens, last.tokens),
        ):
            if now is not None and before is not None and now >= before:
                plot.series.setdefault(plot.unit, []).append((t, (now - before) / span))

    def _add_step_time(self, t: float, step: float) -> None:
        base = self._step_base
        if base is not None and step == base[1]:
            return
        self._step_base = (t, step)
        if base is not None and step > base[1] and t > base[0]:
            self._step_time.series.setdefault("s/step", []).append((t, (t - base[0]) / (step - base[1])))

    def plots(self) -> list[Plot]:
        """The plots with something to draw, in the page's order."""
        ordered = (self._steps, self._rate, self._step_time, self._samples, self._tokens)
        return [plot for plot in ordered if plot.series]
