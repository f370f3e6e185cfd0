"""No models of its own. The module exists because Django sends ``post_migrate`` only for
apps that have one, and this app's receiver (``apps.py``) syncs the roles after every
migrate: permissions of models added since (a connection's) reach their roles."""
