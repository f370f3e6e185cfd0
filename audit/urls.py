from django.urls import path

from audit import views

urlpatterns = [path("audit/", views.entry_list, name="audit-list")]
