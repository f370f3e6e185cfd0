from django.urls import path

from api import views

urlpatterns = [
    path("account/tokens/", views.tokens, name="api-tokens"),
    path("account/tokens/new/", views.token_create, name="api-token-create"),
    path("account/tokens/<int:pk>/revoke/", views.token_revoke, name="api-token-revoke"),
]
