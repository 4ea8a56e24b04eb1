# The console app has no models: its pages and consumers read and change those of the apps below it.
