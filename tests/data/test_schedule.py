"""Tests of tasks/data/schedule.py: multitask schedules (sequential, round-robin, even batching) and loss weights."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tasks.data.schedule import SCHEDULES, LossWeights, MultitaskSchedule


def task_lengths() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(0)
    sizes = {"sst": 70, "para": 200, "sts": 45}
    return {t: torch.randint(3, 50, (n,), generator=g).tolist() for t, n in sizes.items()}


def per_task(plan):
    out: dict[str, list[list[int]]] = {}
    for task, batch in plan:
        out.setdefault(task, []).append(batch)
    return out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_example_once_per_epoch(schedule):
    """Each task's examples appear exactly once per epoch, in ceil(n / batch_size) batches, under every schedule."""
    lengths = task_lengths()
    sched = MultitaskSchedule(lengths, 16, schedule, seed=3)
    plan = sched.epoch_plan(0)
    assert len(plan) == sched.steps_per_epoch()
    got = per_task(plan)
    for task, ls in lengths.items():
        assert sorted(i for b in got[task] for i in b) == list(range(len(ls)))
        assert len(got[task]) == -(-len(ls) // 16)


def test_schedules_reorder_the_same_batches():
    """The three schedules differ only in order: for one (seed, epoch) they hold the same (task, batch) multiset."""
    plans = [MultitaskSchedule(task_lengths(), 16, s, seed=5).epoch_plan(2) for s in SCHEDULES]
    keys = [Counter((t, tuple(b)) for t, b in plan) for plan in plans]
    assert keys[0] == keys[1] == keys[2]


def test_sequential_and_round_robin_orders():
    """Sequential runs each task's batches as a block; round-robin cycles tasks and drops those that run out."""
    lengths = {"a": [5] * 48, "b": [5] * 16, "c": [5] * 32}  # 3, 1, 2 batches of 16
    sequential = [t for t, _ in MultitaskSchedule(lengths, 16, "sequential").epoch_plan(0)]
    assert sequential == ["a", "a", "a", "b", "c", "c"]
    round_robin = [t for t, _ in MultitaskSchedule(lengths, 16, "round_robin").epoch_plan(0)]
    assert round_robin == ["a", "b", "c", "a", "c", "a"]


def test_even_batching_interleaves_tasks():
    """Even batching (§4.2) mixes tasks across the epoch instead of running them as blocks."""
    lengths = task_lengths()
    order = [t for t, _ in MultitaskSchedule(lengths, 8, "even", seed=0).epoch_plan(0)]
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches > 10 * (len(lengths) - 1)  # sequential has exactly len(tasks) - 1
    half = len(order) // 2
    for task in lengths:
        assert task in order[:half] and task in order[half:]


def test_plan_depends_only_on_seed_and_epoch():
    """Same (seed, epoch) gives the identical plan; other epochs and seeds differ; the global RNG is untouched."""
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = MultitaskSchedule(task_lengths(), 16, "even", seed=7)
    b = MultitaskSchedule(task_lengths(), 16, "even", seed=7)
    assert a.epoch_plan(0) == b.epoch_plan(0)
    assert a.epoch_plan(3) == b.epoch_plan(3)
    assert a.epoch_plan(0) != a.epoch_plan(1)
    assert a.epoch_plan(0) != MultitaskSchedule(task_lengths(), 16, "even", seed=8).epoch_plan(0)
    assert torch.equal(torch.get_rng_state(), state)


def test_task_batches_independent_of_other_tasks():
    """A task's batches for an epoch do not change when another task is added to the schedule."""
    lengths = task_lengths()
    alone = MultitaskSchedule({"sst": lengths["sst"]}, 16, "even", seed=1).task_batches("sst", 4)
    together = MultitaskSchedule(lengths, 16, "even", seed=1).task_batches("sst", 4)
    assert alone == together


def test_per_task_cap_draws_fresh_subsets():
    """A per-task cap gives exactly that many distinct examples per epoch, a different subset each epoch."""
    lengths = task_lengths()
    sched = MultitaskSchedule(lengths, 16, "even", seed=0, max_examples_per_epoch={"para": 50, "sst": None})
    subsets = []
    for epoch in range(3):
        got = per_task(sched.epoch_plan(epoch))
        para = [i for b in got["para"] for i in b]
        assert len(para) == len(set(para)) == 50 and all(0 <= i < 200 for i in para)
        assert sorted(i for b in got["sst"] for i in b) == list(range(70))
        subsets.append(frozenset(para))
    assert len(set(subsets)) == 3
    assert sched.steps_per_epoch() == -(-70 // 16) + -(-50 // 16) + -(-45 // 16) == len(sched.epoch_plan(0))


def test_cycled_subsets_see_every_example_before_any_repeats():
    """subsets="cycle": consecutive epochs take the next examples of one shuffled pass (cap 50 of 200: four
    epochs are exactly one pass); past a pass the next shuffle continues; other tasks are untouched."""
    lengths = task_lengths()
    fresh = MultitaskSchedule(lengths, 16, "even", seed=0, max_examples_per_epoch={"para": 50})
    cycle = MultitaskSchedule(lengths, 16, "even", seed=0, max_examples_per_epoch={"para": 50}, subsets="cycle")
    seen = []
    for epoch in range(4):
        got = per_task(cycle.epoch_plan(epoch))
        para = [i for b in got["para"] for i in b]
        assert len(para) == len(set(para)) == 50
        seen += para
        assert got["sst"] == per_task(fresh.epoch_plan(epoch))["sst"]
    assert sorted(seen) == list(range(200))
    union = set()
    for epoch in range(4):  # fresh draws repeat examples and miss others over the same four epochs
        union |= {i for b in per_task(fresh.epoch_plan(epoch))["para"] for i in b}
    assert len(union) < 200
    uneven = MultitaskSchedule(lengths, 16, "even", seed=0, max_examples_per_epoch={"para": 60}, subsets="cycle")
    firsts = [i for epoch in range(3) for b in per_task(uneven.epoch_plan(epoch))["para"] for i in b]
    assert len(set(firsts)) == 180
    fourth = {i for b in per_task(uneven.epoch_plan(3))["para"] for i in b}
    assert set(range(200)) - set(firsts) <= fourth  # the pass's last 20, then the next pass begins


def test_swapped_pairs_are_index_plus_n_with_the_given_probability():
    """swap={"para": p}: each para index i becomes i + N with probability p, drawn per (seed, epoch); mod N
    the plan is the unswapped one, so batches, order and the other tasks do not change."""
    lengths = task_lengths()
    plain = MultitaskSchedule(lengths, 16, "even", seed=2)
    swapping = MultitaskSchedule(lengths, 16, "even", seed=2, swap={"para": 0.5})
    flips = []
    for epoch in range(2):
        a, b = plain.epoch_plan(epoch), swapping.epoch_plan(epoch)
        assert [(t, [i % 200 if t == "para" else i for i in batch]) for t, batch in b] == a
        assert all(i < len(lengths[t]) for t, batch in b if t != "para" for i in batch)
        flips.append([i >= 200 for t, batch in b if t == "para" for i in batch])
    assert all(0.35 < sum(f) / 200 < 0.65 for f in flips) and flips[0] != flips[1]
    assert swapping.epoch_plan(1) == MultitaskSchedule(lengths, 16, "even", seed=2, swap={"para": 0.5}).epoch_plan(1)
    everything = MultitaskSchedule(lengths, 16, "even", seed=2, swap={"para": 1.0, "sts": 0.0}).epoch_plan(0)
    assert all(i >= 200 for t, batch in everything if t == "para" for i in batch)


def test_bucketing_switch_changes_composition_not_coverage():
    """bucket=False gives plain random batches: the same coverage, more padding than bucketed batches."""
    lengths = {"sst": [3 + (i * 37) % 120 for i in range(1000)]}
    cost = {}
    for bucket in (True, False):
        plan = MultitaskSchedule(lengths, 16, "sequential", seed=0, bucket=bucket).epoch_plan(0)
        assert sorted(i for _, b in plan for i in b) == list(range(1000))
        cost[bucket] = sum(max(lengths["sst"][i] for i in b) * len(b) for _, b in plan)
    assert cost[True] < cost[False]


def test_a_schedule_refuses_streams_it_does_not_have():
    """Caps for a stream the schedule does not have, and a stream without examples, raise; a run's settings (the
    schedule's name, equal batch sizes for even batching) are TrainConfig.validate's to check (tests/test_train_config.py)."""
    MultitaskSchedule(task_lengths(), {"sst": 8, "para": 16, "sts": 8}, "round_robin")
    with pytest.raises(ValueError, match="unknown task"):
        MultitaskSchedule(task_lengths(), 16, "even", max_examples_per_epoch={"nli": 10})
    with pytest.raises(ValueError, match="no examples"):
        MultitaskSchedule({"sst": []}, 16, "even")


def test_loss_weights():
    """Default weights are 1.0 (any stream, a user's task too); a named weight is that stream's alone; negatives
    raise."""
    w = LossWeights()
    assert (w.get("sst"), w.get("para"), w.get("sts"), w.get("nli"), w.get("topic")) == (1.0,) * 5
    paper = LossWeights({"para": 0.1})  # §4.2 loss rescaling
    assert paper.get("para") == 0.1 and paper.get("sst") == paper.get("sts") == 1.0
    assert LossWeights({"nli": 0.5}).get("nli") == 0.5
    with pytest.raises(ValueError):
        LossWeights({"sts": -1.0})


def test_first_tasks_open_every_epoch_and_the_rest_keeps_its_schedule():
    """``first`` puts a task's batches at the start of each epoch's plan; the other tasks' batches follow, ordered
    by the schedule as they would be without the first task's."""
    lengths = {**task_lengths(), "phrases": [4] * 40}
    sched = MultitaskSchedule(lengths, 8, "even", seed=2, first=("phrases",))
    plan = sched.epoch_plan(1)
    assert [t for t, _ in plan[:5]] == ["phrases"] * 5 and "phrases" not in {t for t, _ in plan[5:]}
    rest = MultitaskSchedule(task_lengths(), 8, "even", seed=2)
    others = [(t, b) for t, b in plan[5:]]
    assert Counter((t, tuple(b)) for t, b in others) == Counter((t, tuple(b)) for t, b in rest.epoch_plan(1))
    mixed = MultitaskSchedule(lengths, 8, "even", seed=2).epoch_plan(1)
    assert [t for t, _ in mixed[:5]] != ["phrases"] * 5
    with pytest.raises(ValueError, match="not tasks"):
        MultitaskSchedule(task_lengths(), 8, "even", first=("phrases",))
