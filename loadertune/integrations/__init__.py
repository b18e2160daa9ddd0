"""loadertune inside the frameworks people train with. Each module imports its framework, an
optional dependency (``pip install loadertune[frameworks]``); nothing else in loadertune does."""
