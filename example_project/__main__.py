"""``python -m example_project``: the Django shop demo (see ``example_project.django_shop``);
``python -m example_project --grow [--backend mariadb]``: the shop grows onto new PostgreSQL (or
MariaDB) servers while orders keep coming (see ``example_project.grow``)."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--grow"]:
        from .grow import main as grow

        sys.exit(grow(sys.argv[2:]))
    from .django_shop import main

    sys.exit(main())
