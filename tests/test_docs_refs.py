"""scripts/check_doc_refs.py: every pointer into docs/ names a file and a
section that exist, and docs link nowhere outside the repository."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_doc_refs", ROOT / "scripts" / "check_doc_refs.py")
check_doc_refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_doc_refs)


def test_the_tree_has_no_broken_pointer():
    assert [p for path in check_doc_refs.tracked_files() for p in check_doc_refs.problems_in(path)] == []


@pytest.fixture
def scratch():
    """A file inside the tree (the checker reports paths relative to it), removed afterwards."""
    path = ROOT / "rust" / "doc_refs_scratch.rs"
    yield path
    path.unlink(missing_ok=True)


def test_a_missing_file_or_section_is_reported_with_its_line(scratch):
    scratch.write_text(
        "// fine: (docs/development.md, Build\n"
        '// settings) and docs/real-model-speed.md, "Threads"\n'
        "// (docs/development.md, Bogus\n"
        "// section) and docs/nope.md\n"
        '/// docs/serve.md` ("Nope here")\n'
    )
    assert check_doc_refs.problems_in(scratch) == [
        'rust/doc_refs_scratch.rs:3: docs/development.md has no section "Bogus section"',
        "rust/doc_refs_scratch.rs:4: docs/nope.md does not exist",
        'rust/doc_refs_scratch.rs:5: docs/serve.md has no section "Nope here"',
    ]


def test_a_section_named_by_its_part_before_a_colon_exists():
    assert check_doc_refs.names_section("Lever 4", ["Lever 4: attention over the paged cache"])
    assert not check_doc_refs.names_section("Lever", ["Lever 4: attention over the paged cache"])
