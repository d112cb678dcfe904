"""The design catalogue's shape: each known-bad design is one change from a named base design, and the
designs labelled shipped are the ones some code implements."""

from __future__ import annotations

import attrs
import pytest

from statemodel.design import DesignKind
from statemodel.designs import CANDIDATES, KNOWN_BAD, KNOWN_BAD_BASES, SHIPPED, _known_bad
from statemodel.policy import Flip, decide_flip

DESCRIPTIVE = {"name", "kind", "summary", "source", "expected_invariant"}  # what a design says, not what it does


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_each_known_bad_design_is_one_change_from_its_base(design: object) -> None:
    base = KNOWN_BAD_BASES[design.name]  # type: ignore[attr-defined]
    changed = {f.name for f in attrs.fields(type(base))
               if f.name not in DESCRIPTIVE and getattr(base, f.name) != getattr(design, f.name)}
    assert len(changed) == 1, changed
    assert base.kind is not DesignKind.KNOWN_BAD


def test_a_known_bad_design_with_two_changes_is_refused() -> None:
    base = KNOWN_BAD_BASES["no_draft_work_while_off"]
    with pytest.raises(ValueError, match="one change from its base"):
        _known_bad(base, name="two", summary="", source="", expected_invariant="kv_conservation",
                   num_steps=3, free_reserved_on_finish=False)


def test_shipped_and_candidate_labels() -> None:
    assert {d.name for d in CANDIDATES} == {"plain_off_catch_up", "plain_off_sync", "v1_plain_off_retract_catch_up",
                                            "v1_plain_off_retract_catch_up_radix"}
    assert "plain_off_retract_catch_up_radix" in {d.name for d in SHIPPED}  # the v2 switch's default keep_out
    assert all(d.kind is DesignKind.CANDIDATE for d in CANDIDATES)
    assert all(d.kind is DesignKind.SHIPPED for d in SHIPPED)
    assert set(KNOWN_BAD_BASES) == {d.name for d in KNOWN_BAD}


def test_flip_policy_hysteresis_and_clamp() -> None:
    # t_off 4, t_on 1, speculation's cap 2
    assert decide_flip(True, 4, 4, 4, 1, 2) is Flip.OFF
    assert decide_flip(True, 3, 3, 4, 1, 2) is None
    assert decide_flip(False, 2, 2, 4, 1, 2) is None  # between t_on and t_off: stay off
    assert decide_flip(False, 1, 1, 4, 1, 2) is Flip.ON
    assert decide_flip(False, 3, 3, 4, 3, 2) is None  # t_on 3 above the cap 2: the clamp holds it off
    assert decide_flip(False, 3, 3, 4, 3, None) is Flip.ON  # no clamp
    assert Flip.OFF == "flip_off" and Flip.ON == "flip_on"  # the model action names traces write


def test_the_v1_retract_design_fails_without_its_catch_up_or_its_tree_marks() -> None:
    """The checker that passes v1_plain_off_retract_catch_up(_radix) (issue 22) refutes each one change away from it:
    no retraction at flip-on (the draft never catches up), and the radix tree taking what was computed while off."""
    import attrs

    from proofs.verdicts import run_design
    from statemodel.design import DraftWhileOff, TreeDraft
    from statemodel.designs import V1_RETRACT_CATCH_UP, V1_RETRACT_CATCH_UP_RADIX

    for design in (attrs.evolve(V1_RETRACT_CATCH_UP, name="v1_no_catch_up", draft_while_off=DraftWhileOff.NONE),
                   attrs.evolve(V1_RETRACT_CATCH_UP_RADIX, name="v1_radix_unmarked", tree_draft=TreeDraft.IGNORED)):
        verdict = run_design(design)
        assert verdict.verdict == "fail", (design.name, verdict.reason)
        assert verdict.invariant == "draft_kv_covers_prefix", (design.name, verdict.reason)
