"""A conversation's messages as a tree: pure functions over (id, parent_id, created_at)
nodes, no database. Siblings (the messages sharing a parent) are ordered oldest first; the
path the user sees runs from a first message down to the conversation's active leaf."""

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Node:
    id: object
    parent_id: object
    created_at: object


@dataclass
class Tree:
    nodes: dict = field(default_factory=dict)  # id -> Node
    children: dict = field(default_factory=lambda: defaultdict(list))  # parent id -> [ids]

    @classmethod
    def build(cls, nodes) -> "Tree":
        tree = cls()
        ordered = sorted(nodes, key=lambda n: (n.created_at, str(n.id)))
        for node in ordered:
            tree.nodes[node.id] = node
        for node in ordered:
            # A parent outside the conversation (never made by the services) counts as none,
            # so that no message is ever unreachable.
            parent = node.parent_id if node.parent_id in tree.nodes else None
            tree.children[parent].append(node.id)
        return tree

    def __contains__(self, message_id) -> bool:
        return message_id in self.nodes

    def parent_of(self, message_id):
        parent = self.nodes[message_id].parent_id
        return parent if parent in self.nodes else None

    def siblings(self, message_id) -> list:
        return list(self.children[self.parent_of(message_id)])

    def path_to(self, message_id) -> list:
        """The ids from a first message down to this one."""
        path = []
        seen = set()
        while message_id is not None and message_id not in seen:
            seen.add(message_id)
            path.append(message_id)
            message_id = self.parent_of(message_id)
        path.reverse()
        return path

    def newest_leaf_under(self, message_id):
        """The most recently created message with no children in this message's subtree (the
        message itself when it has none): where switching to a branch lands."""
        newest = message_id
        stack = [message_id]
        while stack:
            current = stack.pop()
            kids = self.children.get(current, [])
            if not kids and self._newer(current, newest):
                newest = current
            stack.extend(kids)
        return newest

    def _newer(self, a, b) -> bool:
        na, nb = self.nodes[a], self.nodes[b]
        return (na.created_at, str(na.id)) > (nb.created_at, str(nb.id))

    def active_path(self, leaf_id) -> list:
        """The path the user sees. Without a usable leaf it runs to the newest leaf, so a
        conversation always shows its latest messages."""
        if leaf_id not in self.nodes:
            roots = self.children.get(None, [])
            if not roots:
                return []
            leaf_id = max(
                (self.newest_leaf_under(r) for r in roots),
                key=lambda i: (self.nodes[i].created_at, str(i)),
            )
        return self.path_to(leaf_id)

    def branches(self, leaf_id) -> list["Branch"]:
        """Every message once, as lines to read: the active path first, then each
        alternative (a sibling off a line) followed down to its newest leaf, in the order
        they fork off. Used by the staff transcript and the exports."""
        main = self.active_path(leaf_id)
        result = [Branch(number=1, messages=main, fork_of=None)]
        placed = set(main)
        queue = list(main)
        while queue:
            message_id = queue.pop(0)
            alternatives = [(s, message_id) for s in self.siblings(message_id)]
            kids = self.children.get(message_id, [])
            if not any(kid in placed for kid in kids):  # the end of a line that goes on
                alternatives += [(kid, None) for kid in kids]
            for start, fork_of in alternatives:
                if start in placed:
                    continue
                line = self.path_to(self.newest_leaf_under(start))
                line = line[line.index(start) :]
                placed.update(line)
                result.append(Branch(number=len(result) + 1, messages=line, fork_of=fork_of))
                queue.extend(line)
        return result


@dataclass(frozen=True)
class Branch:
    number: int
    messages: list  # ids, in order
    # The message this line is another version of; None for the active path and for a line
    # that goes on from the end of another (its first message's parent says where).
    fork_of: object
