"""Scenario files: what is accepted, what is refused, and how each refusal reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrouter.errors import UsageError
from mindrouter.simulate import (
    ScenarioError,
    example_names,
    load_example,
    load_scenario,
    parse_scenario,
    simulate,
)

REPO = Path(__file__).resolve().parent.parent
PACKAGED = REPO / "mindrouter" / "simulate" / "examples"

BASE = """
duration = 600
seed = 3
[groups]
faculty = 3
[[backends]]
name = "gpu1"
models = ["llama3"]
max_concurrent = 4
tokens_per_second = 50
[[users]]
name = "prof"
group = "faculty"
model = "llama3"
concurrency = 2
"""


def test_minimal_scenario_and_defaults():
    sc = parse_scenario(BASE)
    assert sc.duration == 600 and sc.seed == 3
    (backend,) = sc.backends
    assert backend.prefill_tokens_per_second == 500  # 10 x the decode rate
    assert backend.loaded_models == ("llama3",)
    (user,) = sc.users
    assert user.weight == 3 and user.group == "faculty"
    assert user.prompt_tokens == (200, 200) and user.completion_tokens == (300, 300)
    assert user.start == 0 and user.stop is None and user.max_tokens is None and user.think_time == (0, 0)
    assert sc.settings.group_weights["faculty"] == 3


def test_clients_stream_by_default_and_may_not_stream_or_leave_early():
    assert parse_scenario(BASE).users[0].stream is True and parse_scenario(BASE).users[0].leave_after is None
    (user,) = parse_scenario(BASE + "stream = false\nleave_after = 10\njson_mode = true\n").users
    assert user.stream is False and user.leave_after == 10 and user.json_mode is True


def test_a_client_that_leaves_after_10_tokens_receives_10_tokens_an_answer():
    sc = parse_scenario(BASE + "leave_after = 10\nrequests = 3\n")
    (user,) = simulate(sc).users
    assert (user.completed, user.completed_tokens) == (3, 3 * (200 + 10))


def test_json_mode_and_unstreamed_requests_are_served_and_charged_as_chat():
    sc = parse_scenario(
        BASE + 'requests = 4\n[[users]]\nname = "ta"\nmodel = "llama3"\nconcurrency = 2\n'
        "requests = 4\njson_mode = true\nstream = false\n"
    )
    prof, ta = simulate(sc).users
    assert (prof.completed, ta.completed) == (4, 4)
    assert ta.completed_tokens == prof.completed_tokens == 4 * (200 + 300)


def test_weights_from_builtin_groups_explicit_weight_and_ranges():
    sc = parse_scenario(BASE.replace('group = "faculty"', 'group = "staff"\nprompt_tokens = [10, 20]\nweight = 2.5'))
    assert sc.users[0].weight == 2.5 and sc.users[0].prompt_tokens == (10, 20)
    sc = parse_scenario(BASE.replace("[groups]\nfaculty = 3\n", "").replace("faculty", "student"))
    assert sc.users[0].weight == 1  # the built-in student weight


def test_scheduler_table_overrides_settings():
    sc = parse_scenario(
        BASE + "[scheduler]\ndeprioritize_threshold = 1.0\nqueue_timeout = 30\n[scheduler.scores]\nmodel_loaded = 5\n"
    )
    assert sc.settings.deprioritize_threshold == 1.0
    assert sc.settings.queue_timeout == 30
    assert sc.settings.scores.model_loaded == 5
    assert (
        sc.settings.shares == "user"
        and parse_scenario(BASE + '[scheduler]\nshares = "group"\n').settings.shares == "group"
    )


def test_entries_with_one_name_are_phases_of_one_user():
    sc = parse_scenario(
        BASE
        + 'stop = 300\n[[users]]\nname = "prof"\nmodel = "llama3"\nrate = 1\nstart = 300\n'
        + '[[users]]\nname = "ta"\nweight = 2\nmodel = "llama3"\nrate = 1\n'
        + "[[events]]\nat = 400\ngroup = 'faculty'\nweight = 4\n[[events]]\nat = 200\nuser = 'ta'\nclear = true\n"
    )
    first, second, ta = sc.users
    assert (first.stop, second.start, second.rate) == (300, 300, 1)
    assert second.group == "faculty" and second.weight == 3 and second.weight_override is None
    assert ta.weight == 2 and ta.weight_override == 2
    assert [(e.at, e.user, e.group, e.weight, e.clear) for e in sc.events] == [
        (200, "ta", None, None, True),
        (400, None, "faculty", 4, False),
    ]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda t: t.replace("duration = 600\n", ""), "duration is missing"),
        (lambda t: t.replace("duration = 600", 'duration = "long"'), "duration must be a number"),
        (lambda t: t.replace("duration = 600", "duration = 0"), "duration must be greater than 0"),
        (lambda t: "durations = 5\n" + t, "unknown key durations"),
        (lambda t: t.replace("seed = 3", "seed = 1.5"), "seed must be a whole number"),
        (lambda t: t.replace("faculty = 3", "faculty = 0"), "groups.faculty must be greater than 0"),
        (lambda t: t.replace("tokens_per_second = 50", ""), "backends[0].tokens_per_second is missing"),
        (
            lambda t: t.replace("max_concurrent = 4", "max_concurrent = 0"),
            "backends[0].max_concurrent must be at least 1",
        ),
        (lambda t: t.replace('models = ["llama3"]', 'models = "llama3"'), "backends[0].models must be a list"),
        (lambda t: t.replace("max_concurrent = 4", "max_concurrent = 4\nslots = 2"), "unknown key backends[0].slots"),
        (
            lambda t: t.replace("max_concurrent = 4", 'max_concurrent = 4\nloaded_models = ["phi"]'),
            "loaded_models names 'phi'",
        ),
        (lambda t: t.replace("concurrency = 2", "concurrency = 2\nrate = 1"), "exactly one of concurrency"),
        (lambda t: t.replace("concurrency = 2", ""), "exactly one of concurrency"),
        (
            lambda t: t.replace("concurrency = 2", "concurrency = true"),
            "users[0] (prof).concurrency must be a whole number",
        ),
        (lambda t: t.replace("concurrency = 2", "rate = 1\nthink_time = 3"), "think_time only applies"),
        (
            lambda t: t.replace('model = "llama3"\nconcurrency', 'model = "phi"\nconcurrency'),
            "users[0] (prof).model 'phi' is served by no backend",
        ),
        (lambda t: t.replace('group = "faculty"', 'group = "visitors"'), "group 'visitors' has no weight"),
        (lambda t: t.replace('group = "faculty"', "weight = -1"), "weight must be greater than 0"),
        (lambda t: t + "prompt_tokens = [300, 100]\n", "prompt_tokens must be [min, max] with min <= max"),
        (lambda t: t + "completion_tokens = [1, 2, 3]\n", "completion_tokens must be a number or a [min, max] pair"),
        (lambda t: t + 'prompt_tokens = "many"\n', "prompt_tokens must be a whole number"),
        (lambda t: t + "start = 50\nstop = 10\n", "stop (10) must be after start (50)"),
        (lambda t: t + "colour = 'red'\n", "unknown key users[0] (prof).colour"),
        (lambda t: t + "stream = 'no'\n", "users[0] (prof).stream must be true or false"),
        (lambda t: t + "leave_after = 0\n", "users[0] (prof).leave_after must be"),
        (
            lambda t: t + '[[users]]\nname = "prof"\ngroup = "staff"\nmodel = "llama3"\nrate = 1\n',
            "users[1] (prof).group is 'staff' but an earlier entry of 'prof' says 'faculty'; entries with one name",
        ),
        (lambda t: t + "[[events]]\nuser = 'prof'\nweight = 2\n", "events[0].at is missing"),
        (lambda t: t + "[[events]]\nat = 5\nweight = 2\n", "events[0] must name exactly one of user or group"),
        (lambda t: t + "[[events]]\nat = 5\nuser = 'prof'\n", "events[0] must set exactly one of weight or clear"),
        (lambda t: t + "[[events]]\nat = 5\nuser = 'ta'\nweight = 2\n", "events[0].user 'ta' is not one of"),
        (lambda t: t + "[[events]]\nat = 5\ngroup = 'staff'\nweight = 2\n", "group 'staff' has no user in it"),
        (lambda t: t + "[[events]]\nat = 5\ngroup = 'faculty'\nclear = true\n", "events[0].clear applies to a user"),
        (lambda t: t + "[[events]]\nat = 5\nuser = 'prof'\nweight = 0\n", "events[0].weight must be greater than 0"),
        (lambda t: t + "[[events]]\nat = 5\nuser = 'prof'\nclear = 1\n", "events[0].clear must be true or false"),
        (lambda t: t + "[[events]]\nat = 5\nuser = 'prof'\nweight = 2\nwhen = 3\n", "unknown key events[0].when"),
        (lambda t: t + "[scheduler]\nfairness_windw = 3\n", "unknown key [scheduler] fairness_windw"),
        (
            lambda t: t + "[scheduler]\ndeprioritize_threshold = 'high'\n",
            "[scheduler] deprioritize_threshold must be a number",
        ),
        (
            lambda t: t + "[scheduler]\nmin_deprioritization = 0\n",
            "[scheduler] min_deprioritization must be greater than 0",
        ),
        (
            lambda t: t + "[scheduler]\nmax_queued_per_user = 2.5\n",
            "[scheduler] max_queued_per_user must be a whole number",
        ),
        (lambda t: t + "[scheduler]\ngroup_weights = 1\n", "unknown key [scheduler] group_weights"),
        (lambda t: t + "[scheduler]\nshares = 'team'\n", '[scheduler] shares must be "user" or "group"'),
        (lambda t: t + "[scheduler]\nshares = 1\n", "[scheduler] shares must be a string"),
        (lambda t: t + "[scheduler]\nprompt_token_cost = 0\n", "[scheduler] prompt_token_cost must be a finite number"),
        (lambda t: t + "[scheduler.scores]\nloaded = 1\n", "unknown key [scheduler.scores] loaded"),
        (lambda t: t.replace("duration = 600", "duration = = 600"), "is not valid TOML"),
        (
            lambda t: t + "[[backends]]\nname = 'gpu1'\nmodels = ['x']\nmax_concurrent = 1\ntokens_per_second = 1\n",
            "two backends are named 'gpu1'",
        ),
    ],
)
def test_refusals_name_the_key_in_one_sentence(change, needle):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(change(BASE), source="lab.toml")
    message = str(info.value)
    assert needle in message
    assert message.startswith("lab.toml: ") or "not valid TOML" in message
    assert "\n" not in message.strip() or "not valid TOML" in message
    assert isinstance(info.value, UsageError) and info.value.exit_code == 2


def test_missing_file_and_unknown_example(tmp_path):
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="the examples are admin-one-student, admin-two-students, "):
        load_example("scenario9")


def test_examples_are_packaged_and_in_sync_with_the_repo_copies():
    """`mr simulate --example` reads the packaged copies; examples/ at the top holds what the README runs."""
    names = example_names()
    assert {"scenario1", "scenario2", "scenario3", "model-switch", "group-shares"} <= set(names)
    for name in names:
        assert load_example(name).name == name
    for copy in sorted((REPO / "examples").glob("*.toml")):
        assert copy.read_bytes() == (PACKAGED / copy.name).read_bytes(), (
            f"examples/{copy.name} and mindrouter/simulate/examples/{copy.name} differ; copy one over the other"
        )
        assert load_scenario(copy) == load_example(copy.stem)


def test_package_exports():
    import mindrouter.simulate as package

    assert sorted(package.__all__) == package.__all__
    for name in package.__all__:
        assert hasattr(package, name), name


def test_docs_hold_the_format_as_the_package_states_it():
    import mindrouter.simulate as package

    assert package.__doc__ is not None
    assert package.__doc__.strip() in (REPO / "docs" / "simulate.md").read_text(encoding="utf-8"), (
        "docs/simulate.md no longer holds mindrouter.simulate's docstring; paste it under 'Scenario format and output'"
    )
