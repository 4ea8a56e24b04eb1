"""API tokens: a name, an owner whose permissions the token acts with, and only the SHA-256 of the secret.

The secret (``cft_`` + 43 URL-safe characters, 256 random bits) is shown once, when the token is
created in the admin or by ``manage.py chatflow_token create``; a lost secret is replaced, never
recovered. Lookups go by the hash (unique index), so a request costs one indexed query and the
comparison cannot leak the secret through timing: the secret is not compared, its hash is looked up.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX = "cft_"
#: last_used_at is written at most this often per token (not one UPDATE per request)
TOUCH_EVERY = timedelta(seconds=60)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class ApiToken(models.Model):
    name = models.CharField(max_length=100, help_text="What or who uses it, e.g. 'BI nightly export'.")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens",
                              help_text="The token acts with this user's permissions.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=16, editable=False, help_text="The secret's first characters.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "chatflow_api_tokens"
        verbose_name = "API token"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…)"

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def set_new_secret(self) -> str:
        """Give the token a new random secret (returned, never stored) and keep its hash."""
        secret = PREFIX + secrets.token_urlsafe(32)
        self.token_hash = hash_secret(secret)
        self.hint = secret[:10]
        return secret

    @classmethod
    def issue(cls, name: str, owner) -> tuple[ApiToken, str]:
        """A new saved token for ``owner`` and its secret (shown once)."""
        token = cls(name=name, owner=owner)
        secret = token.set_new_secret()
        token.save()
        return token, secret

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])

    @classmethod
    def authenticate(cls, secret: str) -> ApiToken | None:
        """The active token with this secret whose owner is active, or None; records the use."""
        if not secret.startswith(PREFIX) or len(secret) > 200:
            return None
        token = (cls.objects.select_related("owner")
                 .filter(token_hash=hash_secret(secret), revoked_at__isnull=True).first())
        if token is None or not token.owner.is_active:
            return None
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > TOUCH_EVERY:
            cls.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token
