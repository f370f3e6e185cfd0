from django.urls import path

from control import views

urlpatterns = [
    path("policies/", views.policy_list, name="policy-list"),
    path("policies/new/", views.policy_edit, name="policy-create"),
    path("policies/<int:pk>/edit/", views.policy_edit, name="policy-edit"),
]
