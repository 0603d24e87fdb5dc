"""`ddiloco run`: a synchronizer and M learner processes on one machine, supervised, with chaos."""
