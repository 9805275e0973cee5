"""Settings refuse what cannot be meant, each with a message that names what is wrong."""

from __future__ import annotations

import pytest

from sidecar.core.errors import ConfigError
from sidecar.settings import load_settings


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_number_is_named_as_such(value: str) -> None:
    with pytest.raises(ConfigError, match=r"deadline\.budget_s: Input should be a finite number$"):
        load_settings({"deadline.budget_s": value})


def test_a_finite_number_out_of_range_says_the_range() -> None:
    with pytest.raises(ConfigError, match=r"deadline\.budget_s: Input should be greater than 0$"):
        load_settings({"deadline.budget_s": -1})


def test_a_key_template_that_cannot_make_a_valid_key_fails_at_load_not_after_the_run() -> None:
    with pytest.raises(ConfigError, match=r"'\.\.' segment"):
        load_settings({"s3.key_template": "{prefix}/../{run_id}/"})


def test_the_exit_grace_is_5_s_by_default_and_bounded() -> None:
    assert load_settings({}).launcher.exit_grace_s == 5.0
    assert load_settings({"launcher.exit_grace_s": 0}).launcher.exit_grace_s == 0.0
    for value, said in ((61, "less than or equal to 60"), (-1, "greater than or equal to 0")):
        with pytest.raises(ConfigError, match=rf"launcher\.exit_grace_s: Input should be {said}$"):
            load_settings({"launcher.exit_grace_s": value})
