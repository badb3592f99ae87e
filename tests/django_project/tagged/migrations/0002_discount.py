from django.db import migrations, models

import snowflake_db.django.fields


class Migration(migrations.Migration):
    dependencies = [
        ("tagged", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Discount",
            fields=[
                (
                    "id",
                    snowflake_db.django.fields.SnowflakeAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("product_id", models.PositiveIntegerField(null=True)),
                ("amount", models.IntegerField(default=0)),
            ],
        ),
    ]
