"""What the command modules of ``plait.cli`` share: the console and error handling (``common``) and
the plan tables (``tables``), and the flags of declared settings (``setting_flags``)."""
