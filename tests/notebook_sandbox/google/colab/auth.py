from . import record


def authenticate_user():
    record("auth.authenticate_user")
