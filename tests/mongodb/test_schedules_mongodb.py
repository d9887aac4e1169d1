"""Schedules (tests/test_schedules.py's ScheduleContract) on MongoDB, through django-mongodb-backend:
the operators' verbs, the missed-ticks rule, check()'s schedule_missed and the races of firers
(all 120 rounds of each: on the test server, SecantusDB, about 40 s)."""
import pytest

from tests.test_schedules import ScheduleContract


class TestMongoDBSchedules(ScheduleContract):
    pytestmark = [pytest.mark.mongodb, pytest.mark.django_db(transaction=True)]
    alias = "default"
