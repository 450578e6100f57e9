"""The argparse flags of declared settings (``plait.run.settings``): one loop, no flag written twice.

Each setting becomes one ``add_argument`` in the help group its declaration names (the group's
title from ``GROUPS``; its first word is the job-file table): a switch (``--X``, or ``--X/--no-X``
when the field may be None), or a flag taking an int, a float or a string, with the setting's
choices, metavar, help (defaults filled in) and default (the flag's: None when ``unset``).
"""

from __future__ import annotations

import argparse

from plait.run.settings import GROUPS, settings_of


def add_setting_flags(parser: argparse.ArgumentParser, *sections: type) -> None:
    """Add the flags of ``sections``' settings to ``parser``, group by group in ``GROUPS`` order."""
    declared = settings_of(*sections)
    for key, title in GROUPS.items():
        mine = [d for d in declared if d.spec.group == key]
        if not mine:
            continue
        group = parser.add_argument_group(title)
        for d in mine:
            options: dict = {"dest": d.dest, "default": d.flag_default, "help": d.help_text()}
            if d.kind is bool:
                options["action"] = argparse.BooleanOptionalAction if d.negatable else "store_true"
            else:
                options.update(type=d.kind if d.kind in (int, float) else None, choices=d.spec.choices,
                               metavar=d.spec.metavar)
            group.add_argument(d.spec.flag, *d.spec.aliases, **options)
