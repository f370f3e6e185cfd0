from django.urls import path

from pipelines import views

urlpatterns = [
    path("pipelines/", views.pipeline_list, name="pipeline-list"),
    path("pipelines/new/", views.pipeline_create, name="pipeline-create"),
    path("pipelines/<int:pk>/edit/", views.pipeline_edit, name="pipeline-edit"),
    path("pipelines/test-source/", views.pipeline_test_source, name="pipeline-test-source"),
    path("connections/", views.connection_list, name="connection-list"),
    path("connections/new/", views.connection_create, name="connection-create"),
    path("connections/<int:pk>/edit/", views.connection_edit, name="connection-edit"),
    path("connections/<int:pk>/test/", views.connection_test, name="connection-test"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/start/", views.run_start, name="run-start"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/stop/", views.run_stop, name="run-stop"),
    path("runs/<int:pk>/restart/", views.run_restart, name="run-restart"),
    path("runs/<int:pk>/workers/", views.run_workers, name="run-workers"),
    path("runs/<int:pk>/rebalance/", views.run_rebalance, name="run-rebalance"),
    path("runs/<int:pk>/frequency/", views.run_frequency, name="run-frequency"),
    path("runs/<int:pk>/replan/", views.run_replan, name="run-replan"),
    path("runs/<int:pk>/plan/", views.run_plan, name="run-plan"),
    path("runs/<int:pk>/move-groups/", views.run_move_groups, name="run-move-groups"),
    path("runs/<int:pk>/dry-run/", views.run_dry_run, name="run-dry-run"),
    path("runs/<int:pk>/verify/", views.run_verify, name="run-verify"),
    path("runs/<int:pk>/policy-version/", views.run_policy_version, name="run-policy-version"),
    path("cluster/", views.cluster_page, name="cluster"),
    path("retention/", views.retention_page, name="retention"),
]
