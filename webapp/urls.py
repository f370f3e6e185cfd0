from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from accounts.forms import LoginForm
from api.prometheus import metrics_view
from api.v1 import api as api_v1

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="fleet", permanent=False)),
    path("login/", auth_views.LoginView.as_view(authentication_form=LoginForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", api_v1.urls),
    path("", include("pipelines.urls")),
    path("", include("control.urls")),
    path("", include("audit.urls")),
    path("", include("api.urls")),
]
