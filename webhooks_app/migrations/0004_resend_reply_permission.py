"""``webhooks_app.resend_reply``: sending a reply to the customer again is its own permission."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("webhooks_app", "0003_delivery_cancelled")]

    operations = [
        migrations.AlterModelOptions(
            name="inbounddelivery",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_delivery", "Can retry a failed webhook delivery"),
                    ("resend_reply", "Can send a delivery's reply to the customer again"),
                ],
                "verbose_name": "inbound delivery",
                "verbose_name_plural": "inbound deliveries",
            },
        ),
    ]
