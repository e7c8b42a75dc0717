"""The tree functions alone: paths, siblings, switching targets, and the reading order of
every branch for transcripts."""

from chat.tree import Node, Tree


def tree_of(*edges):
    """edges: (id, parent) in creation order."""
    return Tree.build(Node(i, p, n) for n, (i, p) in enumerate(edges))


# q1 a1 q2 a2 ; a2' regenerated beside a2 ; q1' edited beside q1 with its reply b1
SAMPLE = tree_of(
    ("q1", None),
    ("a1", "q1"),
    ("q2", "a1"),
    ("a2", "q2"),
    ("a2'", "q2"),
    ("q1'", None),
    ("b1", "q1'"),
)


def test_paths_and_siblings():
    assert SAMPLE.path_to("a2") == ["q1", "a1", "q2", "a2"]
    assert SAMPLE.siblings("a2") == ["a2", "a2'"]
    assert SAMPLE.siblings("q1'") == ["q1", "q1'"]
    assert SAMPLE.siblings("a1") == ["a1"]


def test_switching_lands_on_the_newest_leaf_under_a_message():
    assert SAMPLE.newest_leaf_under("q1") == "a2'"
    assert SAMPLE.newest_leaf_under("a2") == "a2"
    assert SAMPLE.newest_leaf_under("q1'") == "b1"


def test_without_a_usable_leaf_the_path_runs_to_the_newest_message():
    assert SAMPLE.active_path(None) == ["q1'", "b1"]
    assert SAMPLE.active_path("gone") == ["q1'", "b1"]
    assert Tree.build([]).active_path(None) == []


def test_branches_list_every_message_once_active_path_first():
    branches = SAMPLE.branches("a2")
    assert [b.messages for b in branches] == [["q1", "a1", "q2", "a2"], ["q1'", "b1"], ["a2'"]]
    assert [b.fork_of for b in branches] == [None, "q1", "a2"]
    placed = [i for b in branches for i in b.messages]
    assert sorted(placed) == sorted(SAMPLE.nodes)


def test_a_line_that_goes_on_past_the_active_leaf_is_listed_too():
    tree = tree_of(("q1", None), ("a1", "q1"), ("q2", "a1"), ("a2", "q2"))
    branches = tree.branches("a1")
    assert [b.messages for b in branches] == [["q1", "a1"], ["q2", "a2"]]
    assert branches[1].fork_of is None


def test_a_parent_outside_the_conversation_counts_as_none():
    tree = tree_of(("x", "elsewhere"), ("y", "x"))
    assert tree.path_to("y") == ["x", "y"] and tree.siblings("x") == ["x"]
