"""The pluggy markers of project ``octavo``: plugin authors decorate their hook functions with ``hookimpl``."""

import pluggy

PROJECT_NAME = "octavo"
ENTRY_POINT_GROUP = "octavo"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
