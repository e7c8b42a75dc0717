"""Who may read other users' conversations: staff with chat.view_conversation, in the
admin and on the event stream alike (a change permission alone must not open them)."""

VIEW_PERMISSION = "chat.view_conversation"


def can_review(user) -> bool:
    return user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION)
