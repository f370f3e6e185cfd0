from django.urls import path

from control import views

urlpatterns = [
    path("fleet/", views.fleet_page, name="fleet"),
    path("policies/", views.policy_list, name="policy-list"),
    path("policies/new/", views.policy_edit, name="policy-create"),
    path("policies/<int:pk>/edit/", views.policy_edit, name="policy-edit"),
    path("lab/", views.lab_list, name="lab-list"),
    path("lab/new/", views.lab_new, name="lab-new"),
    path("lab/new/fleet/", views.lab_fleet_new, name="lab-fleet-new"),
    path("lab/<int:pk>/", views.lab_detail, name="lab-detail"),
    path("lab/<int:pk>/status.json", views.lab_status, name="lab-status"),
    path("lab/<int:pk>/bundle.zip", views.lab_bundle, name="lab-bundle"),
    path("lab/<int:pk>/policy/", views.lab_make_policy, name="lab-policy"),
]
