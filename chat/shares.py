"""Share links: writes. A link shows a snapshot of the owner's active path, read-only, at
/s/<token>/; the token is the only secret, so it carries 192 random bits."""

import secrets

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from chat import selectors
from chat.models import Conversation, Message, ShareLink
from chat.services import Conflict, ServiceError

TOKEN_BYTES = 24  # 192 bits, 32 URL-safe characters


def share_url(link: ShareLink) -> str:
    return reverse("chat:share", args=[link.token])


def share_create(*, conversation: Conversation, show_owner: bool) -> tuple[ShareLink, bool]:
    """The conversation's link, pointing at the active path as it is now; (link, created).

    A conversation has one live link: sharing again moves its snapshot to the current path
    and keeps the address, so a link already sent goes on working."""
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(pk=conversation.pk)
        path = selectors.conversation_tree(conversation=conversation).active_path(
            conversation.active_leaf_id
        )
        if not path:
            raise ServiceError("There is nothing to share yet: send a message first.")
        leaf = Message.objects.get(pk=path[-1])
        if leaf.status == Message.Status.STREAMING:
            raise Conflict("A reply is still being written. Share once it has finished.")
        link = selectors.share_link_current(conversation=conversation)
        if link is not None:
            link.leaf, link.show_owner = leaf, show_owner
            link.save(update_fields=["leaf", "show_owner", "updated_at"])
            return link, False
        link = ShareLink.objects.create(
            token=secrets.token_urlsafe(TOKEN_BYTES),
            conversation=conversation,
            leaf=leaf,
            show_owner=show_owner,
        )
        return link, True


def share_revoke(*, conversation: Conversation) -> None:
    """Revoke the conversation's links; their addresses are 404 from now on, for good."""
    conversation.share_links.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
